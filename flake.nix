{
  description = "drums: many isolated, resettable, forkable Linux desktops on one host (CRIU)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs =
    { self, nixpkgs }:
    let
      # CRIU and the slots' namespaces are Linux-only; VM tests need KVM on x86_64 or aarch64.
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems =
        f:
        nixpkgs.lib.genAttrs systems (
          system:
          f system (
            import nixpkgs {
              inherit system;
              overlays = [ self.overlays.default ];
            }
          )
        );
    in
    {
      overlays.default = import ./nix/overlay.nix;

      packages = forAllSystems (
        system: pkgs: {
          inherit (pkgs)
            drumsd
            drums-sdk
            drums-verifiers
            drums-tasks
            drums-pool
            ;
          criu = pkgs.drums-criu;
          desktop-image = pkgs.drums-desktop-image;
          # From nix/images.lock.json (the Debian packages `drumsd image build` installs); built
          # in a VM (KVM).
          image-base = pkgs.drums-image-base;
          image-office = pkgs.drums-image-office;
          image-osworld = pkgs.drums-image-osworld;
          # From nix/checker-venv.lock.json: CPython 3.11 wheels for x86_64 and aarch64.
          checker-venv = pkgs.drums-checker-venv;
          # OSWorld's task files at nix/osworld-tasks.pin.json's commit.
          osworld-tasks = pkgs.drums-osworld-tasks-pinned;
          default = pkgs.drumsd;
        }
      );

      # nix run .#drumsd -- serve --config /etc/drums/drumsd.json
      apps = forAllSystems (
        system: pkgs: rec {
          drumsd = {
            type = "app";
            program = "${pkgs.drumsd}/bin/drumsd";
          };
          default = drumsd;
        }
      );

      devShells = forAllSystems (
        system: pkgs: {
          default = pkgs.mkShell {
            # The packages' own Python dependencies (propagated), without installing drums itself:
            # the shellHook puts the checkout's sources first on PYTHONPATH.
            inputsFrom = [
              pkgs.drumsd
              pkgs.drums-tasks
            ];
            packages = [
              pkgs.python3Packages.pytest
              pkgs.python3Packages.pytest-trio
              pkgs.python3Packages.hypothesis
              pkgs.drums-criu
              pkgs.uv
              pkgs.ruff
              pkgs.nixfmt
              pkgs.curl
            ];
            shellHook = ''
              export PYTHONPATH="$PWD/drumsd/src:$PWD/sdk/src:$PWD/taskfactory/src:$PWD/verifiers_env/src''${PYTHONPATH:+:$PYTHONPATH}"
            '';
          };
        }
      );

      # A path, not its import: the module system then names this file in its errors (an
      # imported function is anonymous there). Nix 2.8 rejected a path; nixpkgs 25.11 needs >= 2.18.
      nixosModules.drumsd = ./nixos-modules/drumsd.nix;
      nixosModules.default = self.nixosModules.drumsd;

      checks = forAllSystems (
        system: pkgs:
        import ./vm-tests {
          inherit pkgs;
          drumsModule = self.nixosModules.drumsd;
        }
      );

      formatter = forAllSystems (system: pkgs: pkgs.nixfmt);
    };
}
