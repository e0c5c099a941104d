# What both OSWorld task-file packages build from their source (nix/osworld-tasks.nix: a commit's
# tarball by sha256; nix/osworld-tasks-pinned.nix: a commit's tree by NAR hash): only
# evaluation_examples/examples, files and directories alone (as drumsd's own fetch keeps), refused
# when it holds no task file, with .drums-osworld.json saying where it came from.
{ lib, runCommand }:
{
  # the package's name in its error message
  label,
  src,
  commit,
  repository,
  # shell that puts the source's evaluation_examples/examples/* into $out/examples
  unpack,
  # the record's name for the pin ("sha256", "nar_hash") and its value
  pinField,
  pin,
  passthru,
  description,
}:
runCommand "osworld-tasks-${builtins.substring 0 12 commit}"
  {
    inherit src passthru;
    meta.description = description;
  }
  ''
    mkdir -p $out/examples
    ${unpack}
    # Task files are data: nothing but files and directories, as drumsd's fetch keeps.
    find $out/examples ! -type f ! -type d -delete
    if [ -z "$(find $out/examples -name '*.json' -print -quit)" ]; then
      echo "${label}: ${repository} at ${commit} holds no evaluation_examples/examples task files" >&2
      exit 1
    fi
    files=$(find $out/examples -type f | wc -l)
    printf '{"repository": "%s", "commit": "%s", "${pinField}": "%s", "files": %s}\n' \
      ${lib.escapeShellArg repository} ${commit} ${lib.escapeShellArg pin} "$files" > $out/.drums-osworld.json
  ''
