# OSWorld's task files at a pinned commit, as drumsd's own `drumsd tasks fetch-osworld` keeps
# them: the commit's GitHub tarball, checked against the pin's sha256 (the sha256 of the tarball
# itself: settings.tasks.osworld.sha256, the same value the daemon's fetch checks), of which only
# evaluation_examples/examples/** (regular files and directories) is kept. A fixed-output fetch:
# the pin is the hash, so Nix refuses any other bytes.
#
# `drums-osworld-tasks { commit = "<40 hex>"; sha256 = "<64 hex>"; }` in drums' overlay; the
# NixOS module calls it when settings.tasks.osworld pins a commit and sets tasks.osworld.dir to
# "<this>/examples".
{
  lib,
  fetchurl,
  runCommand,
}:
{
  commit,
  sha256,
  repository ? "https://github.com/xlang-ai/OSWorld",
}:
assert lib.assertMsg (builtins.match "[0-9a-f]{40}" commit != null)
  "drums-osworld-tasks: commit must be 40 lowercase hex digits (a full git commit id), not ${commit}";
assert lib.assertMsg (builtins.match "[0-9a-f]{64}" sha256 != null)
  "drums-osworld-tasks: sha256 must be 64 lowercase hex digits (the tarball's sha256), not ${sha256}";
import ./osworld-examples.nix { inherit lib runCommand; } {
  label = "drums-osworld-tasks";
  src = fetchurl {
    url = "${lib.removeSuffix ".git" (lib.removeSuffix "/" repository)}/archive/${commit}.tar.gz";
    inherit sha256;
    name = "osworld-${commit}.tar.gz";
  };
  inherit commit repository;
  unpack = ''
    tar -xzf $src -C $out/examples --strip-components=3 --no-same-owner \
      --wildcards '*/evaluation_examples/examples/*'
  '';
  pinField = "sha256";
  pin = sha256;
  passthru = {
    inherit commit sha256 repository;
  };
  description = "OSWorld's task files (evaluation_examples/examples) at ${commit}";
}
