# Evaluates nix/python-packages.nix with a stub lib and a stub python3Packages holding only the
# names given, and reports each package's pname, dependencies and optional dependencies.
# tests/nix/test_nix_python_deps.py compares them with the pyproject.toml files.
{ namesJson }:
let
  names = builtins.fromJSON namesJson;
  stubPackage = name: {
    pname = name;
    # An extra's packages, named like the extra (hypercorn[trio], ray[default]).
    optional-dependencies.trio = [ { pname = "trio"; } ];
    optional-dependencies.default = [ { pname = "default"; } ];
  };
  lib = {
    fileset = {
      toSource = { root, fileset }: root;
      unions = paths: paths;
    };
    optional = cond: x: if cond then [ x ] else [ ];
    licenses.asl20 = "asl20";
    platforms.linux = [ ];
  };
  python3Packages =
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = stubPackage name;
      }) names
    )
    // {
      buildPythonPackage = args: args;
      buildPythonApplication = args: args;
    };
  packages = import ../../nix/python-packages.nix { inherit lib python3Packages; };
  pnames = map (p: p.pname);
in
builtins.mapAttrs (_: p: {
  inherit (p) pname pyproject;
  dependencies = pnames p.dependencies;
  optional = builtins.mapAttrs (_: pnames) (p.optional-dependencies or { });
  removed = p.pythonRemoveDeps or [ ];
}) packages
