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
import ./osworld-examples.nix { inherit lib runCommand; } {
  label = "drums-osworld-tasks-pinned";
  inherit src repository;
  commit = pin.rev;
  unpack = "cp -r --no-preserve=mode,ownership $src/evaluation_examples/examples/. $out/examples/";
  pinField = "nar_hash";
  pin = pin.hash;
  passthru = {
    inherit pin repository;
    commit = pin.rev;
  };
  description = "OSWorld's task files (evaluation_examples/examples) at ${pin.owner}/${pin.repo}@${pin.rev}";
}
