# nix/uv-lock.nix and nix/python-packages.nix evaluated with nixpkgs' real lib and stand-ins that
# record what they are given (fetchurl's url and sha256, buildPythonPackage's dependencies), for a
# Python version and machine. tests/nix/test_nix_uv_lock.py compares the result with uv.lock.
{
  libPath,
  pythonVersion,
  machine ? "x86_64",
  lockFile ? ../../uv.lock,
}:
let
  lib = import libPath;
  record = args: args;
  python3Packages = {
    python.version = pythonVersion;
    buildPythonPackage = record;
    buildPythonApplication = record;
    hatchling = {
      pname = "hatchling";
      version = "build-system";
    };
    setuptools = {
      pname = "setuptools";
      version = "build-system";
    };
  };
  fetchurl = record;
  autoPatchelfHook = "autoPatchelfHook";
  zlib = "zlib";
  stdenv = {
    cc.cc.lib = "libstdc++";
    hostPlatform.parsed.cpu.name = machine;
  };
  lockFor = import ../../nix/uv-lock.nix {
    inherit
      lib
      python3Packages
      fetchurl
      autoPatchelfHook
      stdenv
      zlib
      machine
      lockFile
      ;
  };
  packages = import ../../nix/python-packages.nix {
    inherit
      lib
      python3Packages
      fetchurl
      autoPatchelfHook
      stdenv
      zlib
      lockFile
      ;
  };
  keyOf = p: "${p.pname}==${p.version}";
  keys = map keyOf;
  memberDependencies = lib.concatMap (
    p: p.dependencies ++ lib.concatLists (lib.attrValues (p.optional-dependencies or { }))
  ) (lib.attrValues packages);
  # Every locked package the members reach (genericClosure: a cycle would still end).
  reached = builtins.genericClosure {
    startSet = map (p: { key = keyOf p; }) (
      lib.filter (p: lockFor.built ? ${keyOf p}) memberDependencies
    );
    operator = item: map (p: { key = keyOf p; }) lockFor.built.${item.key}.dependencies;
  };
in
builtins.toJSON {
  locked = lib.listToAttrs (
    map (
      item:
      let
        p = lockFor.built.${item.key};
      in
      lib.nameValuePair item.key {
        inherit (p.src) url sha256;
        format = p.format or "pyproject";
        patchelf = p ? nativeBuildInputs;
        dependencies = keys p.dependencies;
      }
    ) reached
  );
  members = lib.mapAttrs (_: p: {
    dependencies = keys p.dependencies;
    extras = lib.mapAttrs (_: keys) (p.optional-dependencies or { });
  }) packages;
}
