# NixOS VM tests of services.drumsd, one per scenario. Each test's logic is a Python module in
# ./scenarios taking a `machine`; tests/nix runs the same modules against a local daemon.
#
# `pkgs` must already carry drums' overlay (the flake's checks pass it so): the nodes use the
# test's read-only pkgs, where services.drumsd finds pkgs.drumsd, pkgs.drums-criu and the image.
{ pkgs, drumsModule }:
let
  lib = pkgs.lib;

  node =
    { pkgs, ... }:
    {
      imports = [ drumsModule ];
      services.drumsd.enable = true;
      # A desktop restore needs about 150 MiB per slot plus the checkpoint on the state tmpfs.
      virtualisation = {
        memorySize = 6144;
        cores = 2;
        diskSize = 8192;
      };
      environment.systemPackages = [
        pkgs.curl
        pkgs.util-linux
        pkgs.procps
      ];
    };

  # The scenario modules, without the bytecode caches a local run leaves beside them.
  scenarios = builtins.path {
    name = "drums-vm-scenarios";
    path = ./scenarios;
    filter = path: type: baseNameOf path != "__pycache__";
  };

  mkTest =
    name: scenario:
    pkgs.testers.runNixOSTest {
      name = "drums-${name}";
      nodes.machine = node;
      # The scenarios are imported from the store; mypy cannot see them from the test script.
      skipTypeCheck = true;
      testScript =
        { nodes, ... }:
        ''
          import sys
          sys.path.insert(0, "${scenarios}")

          import drums_http
          import ${scenario}

          target = drums_http.Target(
              config_path="${nodes.machine.services.drumsd.configFile}",
              state_dir="${nodes.machine.services.drumsd.settings.state_dir}",
              journal_dir="${nodes.machine.services.drumsd.settings.journal_dir}",
              token_file="${toString nodes.machine.services.drumsd.tokenFile}",
          )
          start_all()
          ${scenario}.run(machine, target, subtest)
        '';
      meta.platforms = lib.platforms.linux;
    };
in
assert lib.assertMsg (pkgs ? drumsd)
  "vm-tests: pkgs lacks drums' overlay; import nixpkgs with overlays = [ drums.overlays.default ]";
{
  vm-daemon-token = mkTest "daemon-token" "daemon_token";
  vm-episode = mkTest "episode" "episode";
  vm-branch-isolation = mkTest "branch-isolation" "branch_isolation";
  vm-gate-quarantine = mkTest "gate-quarantine" "gate_quarantine";
  vm-crash-recovery = mkTest "crash-recovery" "crash_recovery";
}
