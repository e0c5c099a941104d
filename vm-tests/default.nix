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
      # Sized so that admission admits each scenario's work (at most four slots held, the
      # template's capture and a fork's): the defaults are a production host's margins (8 GiB
      # free on the state dir, 4 GiB of RAM), which refused every create on a 3 GiB tmpfs.
      # tests/nix/test_nix_nixos_eval.py checks these against drumsd's own admission decision.
      services.drumsd = {
        enable = true;
        stateTmpfsSize = "4G";
        settings.admission = {
          min_available_mib = 1024;
          min_available_pct = 2;
          min_state_free_mib = 1024;
          env_mib = 512;
          capture_mib = 1024;
        };
      };
      virtualisation = {
        memorySize = 8192;
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
  vm-fork-isolation = mkTest "fork-isolation" "fork_isolation";
  vm-gate-quarantine = mkTest "gate-quarantine" "gate_quarantine";
  vm-crash-recovery = mkTest "crash-recovery" "crash_recovery";
}
