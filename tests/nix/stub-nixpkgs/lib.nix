# nixpkgs' own lib (25.11), put beside this file by tests/nix/test_nix_flake_check.py from
# ../shared/nixpkgs-snapshot: drums' Nix files use much of it (nix/uv-lock.nix reads uv.lock).
import ./lib
