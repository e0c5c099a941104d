# The four Python distributions of the drums workspace, built from this checkout with
# pyproject = true (hatchling). The dependency lists mirror each pyproject.toml;
# tests/nix/test_nix_python_deps.py fails when the two disagree.
{ lib, python3Packages }:
let
  ps = python3Packages;

  # Only pyproject.toml and src/: caches, tests and venvs never enter the store.
  sourceOf =
    dir:
    lib.fileset.toSource {
      root = dir;
      fileset = lib.fileset.unions [
        (dir + "/pyproject.toml")
        (dir + "/src")
      ];
    };

  meta = {
    license = lib.licenses.asl20;
    platforms = lib.platforms.linux;
  };

  drums-sdk = ps.buildPythonPackage {
    pname = "drums-sdk";
    version = "0.1.0";
    pyproject = true;
    src = sourceOf ../sdk;
    build-system = [ ps.hatchling ];
    dependencies = [
      ps.httpx
      ps.pydantic
      ps.anyio
    ];
    optional-dependencies = {
      image = [ ps.pillow ];
      # drums.ray: `drums pool join` and the pool (services.drumsd.ray runs it).
      ray = [
        ps.ray
        ps.hypercorn
      ]
      ++ ps.ray.optional-dependencies.default;
      # drums mcp: desktops as MCP tools (the official MCP SDK) over stdio or streamable HTTP.
      mcp = [
        ps.mcp
        ps.uvicorn
      ];
      test = [
        ps.pytest
        ps.pytest-trio
        ps.trio
        ps.hypercorn
        ps.pillow
      ];
    };
    pythonImportsCheck = [ "drums" ];
    meta = meta // {
      description = "Python client for drumsd: isolated, resettable, forkable Linux desktops";
    };
  };

  drumsd = ps.buildPythonApplication {
    pname = "drumsd";
    version = "0.1.0";
    pyproject = true;
    src = sourceOf ../drumsd;
    build-system = [ ps.hatchling ];
    dependencies = [
      drums-sdk
      ps.trio
      ps.quart-trio
      ps.quart
      ps.hypercorn
      ps.pydantic
      ps.zstandard
      ps.pillow
    ]
    ++ ps.hypercorn.optional-dependencies.trio;
    pythonImportsCheck = [ "drumsd" ];
    meta = meta // {
      description = "drums host daemon: CRIU-restored Linux desktops as RL environments";
      mainProgram = "drumsd";
    };
  };

  drums-tasks = ps.buildPythonPackage {
    pname = "drums-tasks";
    version = "0.1.0";
    pyproject = true;
    src = sourceOf ../taskfactory;
    build-system = [ ps.hatchling ];
    dependencies = [
      ps.openpyxl
      ps.python-docx
      ps.python-pptx
      ps.pillow
      ps.pypdf
      ps.pymupdf
      ps.odfpy
    ];
    optional-dependencies.validate = [ drums-sdk ];
    pythonImportsCheck = [ "drums_tasks" ];
    meta = meta // {
      description = "Seeded desktop task factory with checkers, oracles and a live validator";
    };
  };

  # `verifiers` (0.4.x) and its dependency tree (prime-*, renderers, mcp 2) are not in nixpkgs,
  # nor are the `verl` and `skyrl` extras (verl, skyrl-gym). This package is a plugin for those
  # libraries: it is built without them and meant for a Python environment that already has
  # them (a trainer's own env, or an overlay that adds them).
  verifiersTree = [
    "verifiers"
    "mcp-types"
    "prime-pydantic-config"
  ];
  drums-verifiers = ps.buildPythonPackage {
    pname = "drums-verifiers";
    version = "0.1.0";
    pyproject = true;
    src = sourceOf ../verifiers_env;
    build-system = [ ps.hatchling ];
    dependencies = [
      drums-sdk
      ps.pillow
      ps.pydantic
    ]
    ++ map (name: ps.${name}) (builtins.filter (name: ps ? ${name}) verifiersTree);
    pythonRemoveDeps = builtins.filter (name: !(ps ? ${name})) verifiersTree;
    # Importing drums_verifiers needs verifiers; check the SDK side only.
    pythonImportsCheck = [ "drums" ];
    meta = meta // {
      description = "drums desktops as environments for verifiers and prime-rl";
    };
  };

  # `drums` (drums pool join) with the SDK's ray extra among its dependencies: the command of
  # services.drumsd.ray. The same source as drums-sdk, as an application of its own closure.
  drums-pool = ps.buildPythonApplication {
    pname = "drums-sdk";
    inherit (drums-sdk) version src build-system;
    pyproject = true;
    dependencies = drums-sdk.dependencies ++ drums-sdk.optional-dependencies.ray;
    pythonImportsCheck = [ "drums.ray" ];
    meta = meta // {
      description = "drums pool CLI (drums pool join) with Ray";
      mainProgram = "drums";
    };
  };
in
{
  inherit
    drumsd
    drums-sdk
    drums-tasks
    drums-verifiers
    drums-pool
    ;
}
