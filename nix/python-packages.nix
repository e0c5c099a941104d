# The four Python distributions of the drums workspace, built from this checkout with
# pyproject = true (hatchling), each on the Python dependencies uv.lock pins (./uv-lock.nix: the
# locked versions, fetched with the lock's hashes; not nixpkgs' versions of them). verifiers and
# its tree (prime-*, renderers, mcp 2) come from the lock too, so drums-verifiers is whole.
# tests/nix/test_nix_uv_lock.py compares every URL and hash with uv.lock.
{
  lib,
  python3Packages,
  fetchurl,
  autoPatchelfHook,
  stdenv,
  zlib,
  lockFile ? ../uv.lock,
}:
let
  ps = python3Packages;
  lockFor = import ./uv-lock.nix {
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

  # The lock's extras of a member as optional-dependencies, plus what the member adds itself.
  extrasOf =
    name: own:
    lib.genAttrs (lockFor.extras name) (extra: lockFor.extra name extra ++ (own.${extra} or [ ]));

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
    dependencies = lockFor.dependencies "drums-sdk";
    # image, mcp, ray (`drums pool join`; services.drumsd.ray runs it), test.
    optional-dependencies = extrasOf "drums-sdk" { };
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
    dependencies = [ drums-sdk ] ++ lockFor.dependencies "drumsd";
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
    dependencies = lockFor.dependencies "drums-tasks";
    optional-dependencies = extrasOf "drums-tasks" { validate = [ drums-sdk ]; };
    pythonImportsCheck = [ "drums_tasks" ];
    meta = meta // {
      description = "Seeded desktop task factory with checkers, oracles and a live validator";
    };
  };

  # verifiers (and prime-rl's env tooling) at the lock's versions; the verl and skyrl extras
  # (torch and the rest of a trainer) stay optional.
  drums-verifiers = ps.buildPythonPackage {
    pname = "drums-verifiers";
    version = "0.1.0";
    pyproject = true;
    src = sourceOf ../verifiers_env;
    build-system = [ ps.hatchling ];
    dependencies = [ drums-sdk ] ++ lockFor.dependencies "drums-verifiers";
    optional-dependencies = extrasOf "drums-verifiers" { };
    pythonImportsCheck = [ "drums_verifiers" ];
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
