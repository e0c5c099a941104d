# drums' nixpkgs overlay: the daemon and its Python siblings, CRIU 4.2.1, the desktop images, the
# checker venv and OSWorld's task files.
# CRIU is added as `drums-criu` rather than replacing `criu`, so that podman, crun and the rest of
# nixpkgs keep their cached builds.
final: prev:
let
  python = import ./python-packages.nix {
    inherit (final)
      lib
      fetchurl
      autoPatchelfHook
      stdenv
      zlib
      ;
    python3Packages = final.python3Packages;
  };
  debianImage =
    profile:
    final.callPackage ./debian-image.nix {
      inherit profile;
      guestSrc = ../drumsd/src/drumsd/guest;
    };
in
{
  inherit (python)
    drumsd
    drums-sdk
    drums-tasks
    drums-verifiers
    drums-pool
    ;
  drums-criu = final.callPackage ./criu.nix { };
  # The images `drumsd image build` makes, from the Debian packages nix/images.lock.json pins
  # (the lock drumsd's own build installs from). The default image is the base one.
  drums-image-base = debianImage "base";
  drums-desktop-image = final.drums-image-base;
  drums-image-office = debianImage "office";
  drums-image-osworld = debianImage "osworld";
  drums-checker-venv = final.callPackage ./checker-venv.nix { };
  # A function: drums-osworld-tasks { commit = "<40 hex>"; sha256 = "<tarball sha256>"; }
  drums-osworld-tasks = import ./osworld-tasks.nix { inherit (final) lib fetchurl runCommand; };
  # OSWorld's task files at the commit nix/osworld-tasks.pin.json pins (tree NAR hash).
  drums-osworld-tasks-pinned = final.callPackage ./osworld-tasks-pinned.nix { };
}
