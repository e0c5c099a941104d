# The checker venv (OSWorld's metric code and its libraries, drumsd.tasks.checker_venv) as a Nix
# derivation from nix/checker-venv.lock.json: desktop-env and every pinned library fetched by the
# URL and sha256 pip chose (nix/lock_checker_venv.py), installed offline with the venv's own pip
# (--no-index --no-deps), compiled wheels patched for the store (autoPatchelfHook), then the same
# metric probe drumsd runs after its own build. The result has the layout drumsd reads
# (bin/python, drums-checker/checker_runner.py, drums-probe.json, drums-venv.json): the NixOS
# module's `checkerVenv` points settings.tasks.checker_venv at it.
#
# The lock is for CPython 3.11 on x86_64 and aarch64 (the wheels' tags): drumsd builds its own
# venv with the host's Python, and numpy 1.26.4 has no wheel for 3.13.
{
  lib,
  stdenv,
  fetchurl,
  python311,
  autoPatchelfHook,
  zlib,
  lockFile ? ./checker-venv.lock.json,
  runner ? ../drumsd/src/drumsd/tasks/checker_runner.py,
}:
let
  lock = lib.importJSON lockFile;
  machine = stdenv.hostPlatform.parsed.cpu.name;
  python = python311;
  fetch = f: {
    fileName = baseNameOf f.url;
    src = fetchurl { inherit (f) url sha256; };
  };
  locked =
    lock.machines.${machine}
      or (throw "nix/checker-venv.lock.json holds wheels for ${lib.concatStringsSep " and " (lib.attrNames lock.machines)}, not ${machine}; add it to nix/lock_checker_venv.py");
  files = map fetch ([ lock.desktop_env ] ++ locked.files);
  copies = lib.concatMapStrings (f: "cp ${f.src} wheels/${f.fileName}\n") files;
in
assert lib.assertMsg (lib.versions.majorMinor python.version == lock.python)
  "nix/checker-venv.lock.json is for Python ${lock.python}, not ${python.version}";
stdenv.mkDerivation {
  pname = "drums-checker-venv";
  version = lock.desktop_env.version;
  dontUnpack = true;
  nativeBuildInputs = [
    python
    autoPatchelfHook
  ];
  # What manylinux wheels link from the system on other distributions.
  buildInputs = [
    stdenv.cc.cc.lib
    zlib
  ];
  passthru = {
    inherit lock files python;
  };
  buildPhase = ''
    runHook preBuild
    mkdir wheels
    ${copies}
    python -m venv $out
    # desktop-env without its dependencies, as drumsd does; the pins are a whole closure.
    $out/bin/python -m pip install -q --no-index --no-deps --no-cache-dir \
      wheels/${(builtins.head files).fileName}
    # odfpy is an sdist: it builds with the venv's own setuptools, offline.
    $out/bin/python -m pip install -q --no-index --no-deps --no-cache-dir --no-build-isolation \
      ${lib.concatMapStringsSep " " (f: "wheels/${f.fileName}") (builtins.tail files)}
    mkdir $out/drums-checker
    cp ${runner} $out/drums-checker/checker_runner.py
    runHook postBuild
  '';
  dontInstall = true;
  # The probe imports every metric module, so it runs after autoPatchelfHook (fixup).
  doInstallCheck = true;
  installCheckPhase = ''
    echo '{"kind": "probe"}' | env -i PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONNOUSERSITE=1 \
      PYMUPDF_MESSAGE=fd:2 $out/bin/python $out/drums-checker/checker_runner.py > probe.json
    $out/bin/python - <<'PY'
    import json, os
    out = os.environ["out"]
    probe = json.load(open("probe.json"))
    json.dump({"exported": probe["exported"], "unsupported": probe["unsupported"]},
              open(f"{out}/drums-probe.json", "w"), indent=1, sort_keys=True)
    meta = {"hash": "nix", "build_s": None, "desktop_env": "desktop-env==${lock.desktop_env.version}",
            "lock_requirements_sha256": "${lock.requirements_sha256}"}
    json.dump(meta, open(f"{out}/drums-venv.json", "w"), indent=1)
    PY
  '';
  meta = {
    description = "drums' checker venv (desktop-env ${lock.desktop_env.version} and its pinned libraries) from nix/checker-venv.lock.json";
    platforms = [ "x86_64-linux" ];
  };
}
