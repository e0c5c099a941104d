# A stand-in for nixpkgs' package set, for evaluating NixOS modules (never for building): each
# name NixOS's modules reach after `pkgs.` (listed by tests/nix/nixos_tree.py from the snapshot's
# nixos/ tree) is an unbuildable derivation whose attributes are again stand-ins, a few levels
# deep. What option merging inspects is modelled more closely: lib, the platform, the formats,
# the trivial writers (which keep their text, so a test can force every rendered script).
#
# Stand-ins are self-similar: read them only through builtins.toJSON, never --strict.
{
  lib,
  namesFile, # JSON: { names, nested, flags } found in the modules
  nixpkgsPath, # the snapshot tree (its nixos/ and lib/)
  system ? "x86_64-linux",
  overlays ? [ ],
  extra ? (_final: { }),
}:
let
  found = builtins.fromJSON (builtins.readFile namesFile);
  platform = lib.systems.elaborate system;

  unbuildable =
    name:
    derivation {
      name = builtins.replaceStrings [ " " "(" ")" "'" ] [ "-" "" "" "" ] name;
      inherit system;
      builder = "/bin/sh";
      args = [
        "-c"
        "echo a stand-in package cannot be built; exit 1"
      ];
    };

  # `pkgs.a.b.c`: a derivation with every nested name (three levels, so the set stays finite),
  # the `withFoo` feature flags off, and callable (pkgs.foo.override { } or a function package).
  standIn =
    depth: name:
    let
      drv = unbuildable "standin-${name}";
      self =
        lib.genAttrs (if depth < 3 then found.nested else [ ]) (n: standIn (depth + 1) n)
        // lib.genAttrs found.flags (_: false)
        // {
          type = "derivation";
          inherit (drv) outPath drvPath;
          name = "standin-${name}-1.0";
          pname = name;
          version = "1.0";
          outputs = [ "out" ];
          outputName = "out";
          out = self;
          passthru = { };
          meta = {
            mainProgram = name;
            platforms = lib.platforms.all;
            available = true;
            broken = false;
            license.free = true;
          };
          override = _: self;
          overrideAttrs = _: self;
          overrideDerivation = _: self;
          extend = _: self;
          __functor = _: _: standIn depth "${name}-called";
        };
    in
    self;

  jsonValue =
    let
      value =
        lib.types.nullOr (
          lib.types.oneOf [
            lib.types.bool
            lib.types.int
            lib.types.float
            lib.types.str
            lib.types.path
            (lib.types.attrsOf value)
            (lib.types.listOf value)
          ]
        )
        // {
          description = "JSON value";
        };
    in
    value;

  # The writers keep what they render: `text` (scripts) and `buildCommand` (runCommand).
  writeTextFile =
    {
      name,
      text,
      executable ? false,
      destination ? "",
      ...
    }:
    let
      self =
        unbuildable name
        // {
          inherit name text executable destination;
          passthru = { };
          meta = { };
          overrideAttrs = f: self // (if builtins.isFunction f then f self else f);
        };
    in
    self;
  writeText = name: text: writeTextFile { inherit name text; };
  script = name: text: writeTextFile {
    inherit name text;
    executable = true;
  };

  format = _args: {
    type = jsonValue;
    generate = name: value: writeText name (builtins.toJSON value);
    lib.types = lib.types;
  };

  modelled = final: {
    inherit lib system;
    _type = "pkgs";
    pkgs = final;
    __splicedPackages = final;
    appendOverlays = _: final;
    extend = _: final;
    path = nixpkgsPath;
    buildPackages = final;
    pkgsBuildBuild = final;
    pkgsBuildHost = final;
    pkgsHostTarget = final;
    pkgsStatic = final;
    pkgsi686Linux = final;
    hostPlatform = platform;
    buildPlatform = platform;
    targetPlatform = platform;
    stdenv = standIn 0 "stdenv" // {
      hostPlatform = platform;
      buildPlatform = platform;
      targetPlatform = platform;
      inherit (platform)
        isLinux
        isDarwin
        is64bit
        isx86
        isx86_64
        isi686
        isAarch64
        isAarch
        isBigEndian
        ;
      shell = "/bin/sh";
      cc = standIn 0 "cc";
    };
    stdenvNoCC = final.stdenv;
    formats = lib.genAttrs [
      "json"
      "yaml"
      "yaml_1_1"
      "yaml_1_2"
      "ini"
      "iniWithGlobalSection"
      "toml"
      "keyValue"
      "gitIni"
      "lua"
      "nixConf"
      "javaProperties"
      "libconfig"
      "pythonVars"
      "xml"
      "systemd"
    ] (_: format);
    inherit writeTextFile writeText;
    writeShellScript = script;
    writeScript = script;
    writeShellScriptBin =
      name: text:
      writeTextFile {
        inherit name text;
        executable = true;
        destination = "/bin/${name}";
      }
      // {
        meta.mainProgram = name;
      };
    writeTextDir =
      path: text:
      writeTextFile {
        name = baseNameOf path;
        inherit text;
        destination = "/${path}";
      };
    callPackage =
      fn: args:
      let
        f = if builtins.isFunction fn then fn else import fn;
      in
      f (builtins.mapAttrs (n: _: final.${n} or (standIn 0 n)) (builtins.functionArgs f) // args);
    runCommand =
      name: env: buildCommand:
      unbuildable name
      // env
      // {
        inherit name buildCommand;
        passthru = env.passthru or { };
      };
    runCommandLocal = final.runCommand;
    runCommandNoCC = final.runCommand;
    runCommandCC = final.runCommand;
    # systemd's feature flags are what NixOS's systemd modules branch on: all on, as in nixpkgs.
    systemd = standIn 0 "systemd" // lib.genAttrs found.flags (_: true) // { version = "256.4"; };
  };

  # nixpkgs' package set is a fixed point its overlays extend; so is this one.
  base = final: lib.genAttrs found.names (standIn 0) // modelled final // extra final;
in
lib.fix (builtins.foldl' (f: overlay: lib.extends overlay f) base overlays)
