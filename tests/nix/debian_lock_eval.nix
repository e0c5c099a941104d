# nix/debian-lock.nix (what nix/debian-image.nix fetches and serves) and nix/checker-venv.nix
# and nix/osworld-tasks.nix evaluated with nixpkgs' real lib and a fetchurl that records what it is
# given. tests/nix/test_nix_debian_lock.py compares the result with the locks.
{
  libPath,
  lockFile ? ../../nix/images.lock.json,
}:
let
  lib = import libPath;
  fetchurl = args: args;
  locked = import ../../nix/debian-lock.nix { inherit lib fetchurl lockFile; };
  profiles = lib.attrNames (lib.importJSON lockFile).profiles;
  one =
    profile: arch:
    let
      l = locked { inherit profile arch; };
    in
    {
      debs = map (d: {
        inherit (d) name;
        inherit (d.deb) url sha256;
        storeName = d.deb.name;
      }) l.debs;
      inherit (l) packagesIndex manifest packages;
      pip = map (p: {
        inherit (p.file) url sha256;
        inherit (p) fileName;
      }) l.pipFiles;
    };
  checkerOn =
    machine:
    import ../../nix/checker-venv.nix {
      inherit lib fetchurl;
      stdenv = {
        hostPlatform.parsed.cpu.name = machine;
        mkDerivation = args: args;
        cc.cc.lib = "libstdc++";
      };
      python311.version = "3.11.14";
      autoPatchelfHook = "autoPatchelfHook";
      zlib = "zlib";
    };
  osworld = import ../../nix/osworld-tasks.nix {
    inherit lib fetchurl;
    runCommand = name: env: script: env // { inherit name script; };
  };
  tasks = osworld {
    commit = "0123456789abcdef0123456789abcdef01234567";
    sha256 = "89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567";
  };
in
builtins.toJSON {
  images = lib.genAttrs profiles (
    profile:
    lib.genAttrs [
      "amd64"
      "arm64"
    ] (one profile)
  );
  checker = lib.genAttrs [ "x86_64" "aarch64" ] (
    machine:
    map (f: {
      inherit (f.src) url sha256;
      inherit (f) fileName;
    }) (checkerOn machine).passthru.files
  );
  # A machine the lock does not cover fails evaluation naming it.
  checkerRiscv = builtins.tryEval (builtins.deepSeq (checkerOn "riscv64").passthru.files true);
  osworld = {
    inherit (tasks.src) url sha256;
    inherit (tasks) name script;
  };
}
