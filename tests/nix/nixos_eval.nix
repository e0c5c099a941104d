# services.drumsd inside NixOS's real module system: nixos/lib/eval-config.nix with every module of
# NixOS, from a tree given by path (the nixos-eval recipe's shim: nixpkgs' lib, a nixos/ tree and a
# stand-in package set; docs/nix.md), plus stand-ins for drums' own packages. Nothing builds; read
# values through builtins.toJSON only (the stand-ins are infinite). tests/nix/test_nix_nixos_eval.py.
{
  shim,
  userJson ? "{}",
  hostJson ? "{}",
  modulePath ? ../../nixos-modules/drumsd.nix,
}:
let
  system = "x86_64-linux";
  drumsStandIns = final: _prev: {
    drumsd = final.runCommand "drumsd-0.1.0" { } "" // {
      pname = "drumsd";
      version = "0.1.0";
      meta.mainProgram = "drumsd";
      pythonModule = {
        sitePackages = "lib/python3.13/site-packages";
        interpreter = "/nix/store/00000000000000000000000000000000-python3/bin/python3.13";
      };
    };
    drums-criu = final.runCommand "criu-4.2.1" { } "" // {
      pname = "criu";
      version = "4.2.1";
    };
    drums-pool = final.runCommand "drums-sdk-0.1.0" { } "" // {
      pname = "drums-sdk";
      version = "0.1.0";
    };
    drums-desktop-image = final.runCommand "drums-desktop-image-base-0.1.0" { } "" // {
      profile = "base";
    };
  };
  pkgs = import shim {
    inherit system;
    overlays = [ drumsStandIns ];
  };
  inherit (pkgs) lib;
  nixos = import (shim + "/nixos/lib/eval-config.nix") {
    inherit system pkgs lib;
    modules = [
      modulePath
      {
        system.stateVersion = "24.11";
        boot.loader.grub.enable = false;
        fileSystems."/" = {
          device = "/dev/vda";
          fsType = "ext4";
        };
        services.drumsd = {
          enable = true;
        } // builtins.fromJSON userJson;
      }
      (builtins.fromJSON hostJson)
    ];
  };
  inherit (nixos) config;
  units = config.systemd.units;
in
lib.mapAttrs (_: builtins.toJSON) {
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
  warnings = config.warnings;
  sysctl = lib.filterAttrs (n: _: lib.hasPrefix "fs.inotify" n || n == "kernel.pid_max") config.boot.kernel.sysctl;
  unitText = units."drumsd.service".text;
  mountUnitText = units."run-drums.mount".text or null;
  rayUnitText = units."drumsd-ray.service".text or null;
}
