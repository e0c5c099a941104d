# Evaluates nixos-modules/drumsd.nix with nixpkgs' module system (lib.evalModules) but without
# nixpkgs' packages or NixOS: the NixOS options the module sets are declared here with plain
# types, and packages are stand-in derivation records. Needs a nixpkgs `lib` directory
# (DRUMS_NIXPKGS_LIB); tests/nix/test_nix_module_eval.py drives it.
{
  libPath,
  userJson ? "{}",
  modulePath ? ../../nixos-modules/drumsd.nix,
}:
let
  lib = import libPath;
  inherit (lib) mkOption types;

  fakePackage = pname: version: {
    type = "derivation";
    name = "${pname}-${version}";
    inherit pname version;
    outPath = "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" pname)}-${pname}-${version}";
    meta.mainProgram = pname;
  };

  jsonValue =
    let
      value =
        types.nullOr (
          types.oneOf [
            types.bool
            types.int
            types.float
            types.str
            types.path
            (types.attrsOf value)
            (types.listOf value)
          ]
        )
        // {
          description = "JSON value";
        };
    in
    value;

  pkgs = {
    formats.json = _: {
      type = jsonValue;
      # A store-path-like string: nothing is written to the store in --eval mode.
      generate = name: value: "/nix/store/${builtins.hashString "md5" (builtins.toJSON value)}-${name}";
    };
    runCommand =
      name: env: script:
      fakePackage name "checked"
      // {
        passthru = { inherit env script; };
      };
    # The script's text stands in for its store path, so tests can read it.
    writeShellScript = name: text: "#!${name}\n${text}";
    # As nixpkgs' buildPythonApplication makes it: bin/drumsd, no pythonModule.
    drumsd = fakePackage "drumsd" "0.1.0";
    drums-criu = fakePackage "criu" "4.2.1";
    drums-pool = fakePackage "drums-sdk" "0.1.0";
    drums-image-base = fakePackage "drums-image-base" "0" // {
      profile = "base";
    };
    criu_4_1 = fakePackage "criu" "4.1.1";
    util-linux = fakePackage "util-linux" "2.41";
    iproute2 = fakePackage "iproute2" "6.16";
    coreutils = fakePackage "coreutils" "9.8";
    procps = fakePackage "procps" "4.0";
    lxcfs = fakePackage "lxcfs" "6.0.5";
    # As nixpkgs' stdenv.cc: the compiler wrapper (bin/cc, bin/gcc).
    stdenv.cc = fakePackage "gcc-wrapper" "14.3.0";
    gnutar = fakePackage "gnutar" "1.35";
  };

  strOpt =
    default:
    mkOption {
      type = types.str;
      inherit default;
    };
  unitList = mkOption {
    type = types.listOf types.str;
    default = [ ];
  };
  # A unit file setting: one atom, or a list (lists concatenate; atoms must agree).
  unitAtom = v: builtins.isBool v || builtins.isInt v || builtins.isString v || builtins.isPath v || lib.isDerivation v;
  unitOption = lib.mkOptionType {
    name = "systemd option";
    check = v: unitAtom v || (builtins.isList v && builtins.all unitAtom v);
    merge =
      loc: defs:
      let
        kept = lib.filterOverrides defs;
      in
      if builtins.any (d: builtins.isList d.value) kept then
        builtins.concatMap (d: lib.toList d.value) kept
      else
        lib.mergeEqualOption loc kept;
  };
  unitSection = mkOption {
    type = types.attrsOf unitOption;
    default = { };
  };

  # The NixOS options drumsd.nix sets, declared loosely: this checks the module's own options,
  # types and logic, not NixOS's.
  nixosStub = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      environment.systemPackages = mkOption {
        type = types.listOf types.package;
        default = [ ];
      };
      boot.kernel.features = mkOption {
        type = types.attrsOf types.bool;
        default = { };
      };
      boot.kernelModules = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      boot.kernelParams = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      # As NixOS types it: one bool/int/string/null per key, merged like mergeOneOption after
      # filterOverrides, so two definitions at the same priority conflict even when equal.
      boot.kernel.sysctl = mkOption {
        type = types.submodule {
          freeformType = types.attrsOf (
            lib.mkOptionType {
              name = "sysctl option value";
              check = v: v == null || builtins.isBool v || builtins.isInt v || builtins.isString v;
              merge = loc: defs: lib.mergeOneOption loc (lib.filterOverrides defs);
            }
          );
        };
        default = { };
      };
      hardware.ksm.enable = mkOption {
        type = types.bool;
        default = false;
      };
      hardware.ksm.sleep = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      networking.hostName = mkOption {
        type = types.str;
        default = "desktops-1";
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      # Typed as NixOS types them (written from NixOS's documented behaviour), so a field NixOS
      # does not know, a wrong type, or two different values of one unit setting fail here too.
      systemd.mounts = mkOption {
        type = types.listOf (
          types.submodule {
            options = {
              description = strOpt "";
              what = mkOption { type = types.str; };
              where = mkOption { type = types.str; };
              type = strOpt "";
              options = mkOption {
                type = types.commas;
                default = "";
              };
            };
          }
        );
        default = [ ];
      };
      systemd.tmpfiles.settings = mkOption {
        type = types.attrsOf (
          types.attrsOf (
            types.attrsOf (
              types.submodule (
                { name, ... }:
                {
                  options = {
                    type = strOpt name;
                    mode = strOpt "-";
                    user = strOpt "-";
                    group = strOpt "-";
                    age = strOpt "-";
                    argument = strOpt "";
                  };
                }
              )
            )
          )
        );
        default = { };
      };
      systemd.services = mkOption {
        type = types.attrsOf (
          types.submodule {
            options = {
              description = strOpt "";
              wantedBy = unitList;
              requiredBy = unitList;
              after = unitList;
              before = unitList;
              wants = unitList;
              requires = unitList;
              partOf = unitList;
              path = mkOption {
                type = types.listOf (types.either types.package types.str);
                default = [ ];
              };
              restartTriggers = mkOption {
                type = types.listOf types.unspecified;
                default = [ ];
              };
              environment = mkOption {
                type = types.attrsOf (types.nullOr (types.oneOf [ types.str types.path types.package ]));
                default = { };
              };
              serviceConfig = unitSection;
              unitConfig = unitSection;
            };
          }
        );
        default = { };
      };
    };
  };

  # What NixOS's own modules define in boot.kernel.sysctl (a 64-bit host), at their priorities.
  nixosSysctl = {
    boot.kernel.sysctl = builtins.listToAttrs (
      map (d: {
        inherit (d) name;
        value = lib.mkOverride d.priority d.value;
      }) (import ./fixtures/nixos-sysctl-definitions.nix)
    );
  };

  user = builtins.fromJSON userJson;

  # `criuPackage = "criu_4_1"` in the JSON picks a stand-in package by name.
  userModule = {
    services.drumsd =
      builtins.removeAttrs user [ "criuPackage" ]
      // lib.optionalAttrs (user ? criuPackage) { criuPackage = pkgs.${user.criuPackage}; };
  };

  evaluated = lib.evalModules {
    modules = [
      nixosStub
      nixosSysctl
      modulePath
      userModule
      { _module.args.pkgs = pkgs; }
    ];
  };
  config = evaluated.config;
  cfg = config.services.drumsd;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  settingsJson = builtins.toJSON cfg.settings;
  settings = cfg.settings;
  checkScript = cfg.configFile.passthru.script;
  service = config.systemd.services.drumsd or null;
  rayService = config.systemd.services.drumsd-ray or null;
  imageService = config.systemd.services.drumsd-image or null;
  mounts = config.systemd.mounts;
  tmpfiles = config.systemd.tmpfiles.settings;
  ksm = config.hardware.ksm;
  firewall = config.networking.firewall.allowedTCPPorts;
  kernel = {
    features = config.boot.kernel.features;
    modules = config.boot.kernelModules;
    params = config.boot.kernelParams;
    sysctl = config.boot.kernel.sysctl;
  };
  tokenScript = builtins.head config.systemd.services.drumsd.serviceConfig.ExecStartPre;
}
