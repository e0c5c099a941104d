# drums' nixpkgs overlay: the daemon and its Python siblings, CRIU 4.2.1 and the desktop image.
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
  drums-desktop-image = final.callPackage ./desktop-image.nix {
    guestSrc = ../drumsd/src/drumsd/guest;
  };
}
