# services.drumsd inside NixOS's real module system: nixos/lib/eval-config.nix with every module
# of NixOS (the snapshot's nixos/ tree, nixpkgs 25.11's lib), stand-in packages, and drums' own
# packages as stand-ins shaped like what nixpkgs makes of them (drumsd a buildPythonApplication:
# bin/drumsd, meta.mainProgram, no pythonModule or interpreter). Also each VM test of vm-tests/
# through NixOS's test framework (runNixOSTest), its node evaluated the same way.
#
# One JSON string holds everything a test reads, so one evaluation forces every unit text and
# every script the module renders, for a host with typical settings and for each VM node.
# tests/nix/test_nix_nixos_eval.py.
{
  tree, # the snapshot unpacked: lib/ and nixos/
  namesFile,
  modulePath ? ../../../nixos-modules/drumsd.nix,
  vmTests ? ../../../vm-tests,
  hostJson ? "{}", # services.drumsd of the typical host, as JSON
  withNodes ? true,
  # The host also takes the locked osworld image and the Nix-built checker venv.
  pinned ? false,
}:
let
  lib = import (tree + "/lib");
  system = "x86_64-linux";

  # What drums' overlay gives, in the shape nixpkgs gives it; nothing else.
  drumsPackages = final: _prev: {
    drumsd = application "drumsd" "0.1.0" "drumsd";
    drums-pool = application "drums-sdk" "0.1.0" "drums";
    drums-criu = package "criu" "4.2.1" { };
    drums-image-base = package "drums-image-base" "0" {
      profile = "base";
      arch = "amd64";
    };
    # nix/debian-image.nix's result: runInLinuxVM keeps mkDerivation's passthru.
    drums-image-osworld = package "drums-image-osworld" "0" {
      profile = "osworld";
      arch = "amd64";
    };
    drums-checker-venv = package "drums-checker-venv" "1.0.2" { };
    # The real function, over fetchurl and runCommand shaped as nixpkgs' (attribute sets kept).
    drums-osworld-tasks = import ../../../nix/osworld-tasks.nix {
      inherit lib;
      fetchurl = args: package "osworld-tarball" "0" args;
      runCommand =
        name: env: script:
        package name "0" (env // { inherit script; });
    };
  };
  package =
    pname: version: passthru:
    let
      drv = derivation {
        name = "${pname}-${version}";
        inherit system;
        builder = "/bin/sh";
      };
    in
    drv
    // {
      inherit pname version passthru;
      meta = { };
    }
    // passthru;
  # buildPythonApplication's result: a derivation with a wrapped bin/<mainProgram> and a `dist`
  # output, and no pythonModule (only buildPythonPackage's results are Python modules).
  application =
    pname: version: mainProgram:
    package pname version { }
    // {
      outputs = [
        "out"
        "dist"
      ];
      meta = {
        inherit mainProgram;
      };
    };

  pkgs = import ./standin-pkgs.nix {
    inherit lib namesFile system;
    nixpkgsPath = tree;
    overlays = [ drumsPackages ];
    extra = final: {
      testers.runNixOSTest =
        testModule:
        (import (tree + "/nixos/lib") { inherit lib; }).runTest {
          imports = [ testModule ];
          hostPkgs = final;
          node.pkgs = final;
        };
    };
  };

  host = import (tree + "/nixos/lib/eval-config.nix") {
    inherit system pkgs lib;
    modules = [
      modulePath
      {
        system.stateVersion = "25.11";
        boot.loader.grub.enable = false;
        fileSystems."/" = {
          device = "/dev/vda";
          fsType = "ext4";
        };
        services.drumsd = builtins.fromJSON hostJson;
      }
      (lib.mkIf pinned {
        services.drumsd.image = pkgs.drums-image-osworld;
        services.drumsd.checkerVenv = pkgs.drums-checker-venv;
      })
    ];
  };

  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  # The text of every script a service runs (writeShellScript keeps its text here).
  scriptsOf =
    service:
    let
      values = lib.flatten (lib.attrValues service.serviceConfig);
      scripts = lib.filter (v: lib.isDerivation v && v ? text) values;
    in
    map (s: s.text) scripts ++ lib.filter (s: s != "") [
      service.script
      service.preStart
      service.postStart
    ];

  # Everything the module renders on one system.
  rendered = config: {
    failedAssertions = failedAssertions config;
    warnings = config.warnings;
    units = lib.mapAttrs (_: u: u.text) (
      lib.filterAttrs (n: _: lib.hasInfix "drums" n) config.systemd.units
    );
    scripts = lib.mapAttrs (_: scriptsOf) (
      lib.filterAttrs (n: _: lib.hasPrefix "drumsd" n) config.systemd.services
    );
    configCheck = config.services.drumsd.configFile.buildCommand;
    settings = config.services.drumsd.settings;
    stateTmpfsSize = config.services.drumsd.stateTmpfsSize;
    tmpfiles = config.systemd.tmpfiles.settings."10-drumsd";
    sysctl = lib.filterAttrs (
      n: _: lib.hasPrefix "fs.inotify" n || n == "kernel.pid_max"
    ) config.boot.kernel.sysctl;
    kernelParams = config.boot.kernelParams;
    firewall = config.networking.firewall.allowedTCPPorts;
  };

  tests = import vmTests {
    inherit pkgs;
    drumsModule = modulePath;
  };
  node =
    test:
    let
      machine = test.config.nodes.machine;
    in
    rendered machine
    // {
      testScript = test.config.testScriptString;
      memorySize = machine.virtualisation.memorySize;
    };
in
builtins.toJSON {
  host = rendered host.config;
  nodes = if withNodes then lib.mapAttrs (_: node) tests else { };
  # Where drums' stand-ins live, for a test that runs a rendered command with real files.
  packages = {
    drumsd = "${pkgs.drumsd}";
    image = "${pkgs.drums-image-base}";
    imageOsworld = "${pkgs.drums-image-osworld}";
    checkerVenv = "${pkgs.drums-checker-venv}";
  };
}
