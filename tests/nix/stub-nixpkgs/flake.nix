# A stand-in for nixpkgs, so that `nix flake check` can evaluate drums' flake offline
# (tests/nix/test_nix_flake_check.py passes it with --override-input nixpkgs). It provides only
# what drums' Nix files use, as unbuildable derivations; it proves the flake's structure and the
# wiring between its files, not that nixpkgs has these attributes.
{
  outputs =
    { self }:
    {
      lib = import ./lib.nix;
    };
}
