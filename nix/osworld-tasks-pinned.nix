# OSWorld's task files at the commit nix/osworld-tasks.pin.json pins, by its NAR hash
# (fetchFromGitHub: the commit's tree, so the hash does not depend on how GitHub compresses its
# tarball), of which only evaluation_examples/examples (files and directories) is kept: the same
# layout as nix/osworld-tasks.nix, so `services.drumsd.osworldTasks = pkgs.drums-osworld-tasks-pinned`
# serves them with no network at run time. tests/nix/test_nix_osworld_pin.py recomputes the hash
# from a clone of the repository when one is present.
{
  lib,
  fetchFromGitHub,
  runCommand,
  pinFile ? ./osworld-tasks.pin.json,
}:
let
  pin = lib.importJSON pinFile;
  src = fetchFromGitHub {
    inherit (pin)
      owner
      repo
      rev
      hash
      ;
  };
  repository = "https://github.com/${pin.owner}/${pin.repo}";
in
assert lib.assertMsg (builtins.match "[0-9a-f]{40}" pin.rev != null)
  "nix/osworld-tasks.pin.json: rev must be a full git commit id (40 lowercase hex), not ${pin.rev}";
runCommand "osworld-tasks-${builtins.substring 0 12 pin.rev}"
  {
    inherit src;
    passthru = {
      inherit pin repository;
      commit = pin.rev;
    };
    meta.description = "OSWorld's task files (evaluation_examples/examples) at ${pin.owner}/${pin.repo}@${pin.rev}";
  }
  ''
    mkdir -p $out/examples
    cp -r --no-preserve=mode,ownership $src/evaluation_examples/examples/. $out/examples/
    # Task files are data: nothing but files and directories, as drumsd's fetch keeps.
    find $out/examples ! -type f ! -type d -delete
    if [ -z "$(find $out/examples -name '*.json' -print -quit)" ]; then
      echo "drums-osworld-tasks-pinned: ${repository} at ${pin.rev} holds no evaluation_examples/examples task files" >&2
      exit 1
    fi
    files=$(find $out/examples -type f | wc -l)
    printf '{"repository": "%s", "commit": "%s", "nar_hash": "%s", "files": %s}\n' \
      ${lib.escapeShellArg repository} ${pin.rev} ${lib.escapeShellArg pin.hash} "$files" > $out/.drums-osworld.json
  ''
