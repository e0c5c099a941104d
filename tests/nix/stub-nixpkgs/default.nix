# `import nixpkgs { system; overlays; }` for the stand-in: a package set of unbuildable
# derivations, with overlays applied the way nixpkgs applies them (final/prev fixed point).
{
  system,
  overlays ? [ ],
  ...
}:
let
  lib = import ./lib.nix;

  force = xs: builtins.foldl' (acc: x: builtins.seq x acc) true xs;

  mkPkg =
    attrs:
    let
      name = attrs.name or "${attrs.pname}-${attrs.version or "0"}";
      drv = derivation {
        inherit name system;
        builder = "/bin/sh";
        args = [
          "-c"
          "echo 'stub nixpkgs: nothing can be built' >&2; exit 1"
        ];
      };
    in
    drv
    // attrs
    // {
      inherit name;
      inherit (drv) outPath drvPath type;
      overrideAttrs = f: mkPkg (attrs // f attrs);
      meta = attrs.meta or { };
    };
  stub = pname: mkPkg { inherit pname; version = "1.0"; };

  sri = hash: builtins.match "sha256-[A-Za-z0-9+/]{43}=" hash != null;

  pythonNames = [
    "hatchling"
    "setuptools"
    "httpx"
    "pydantic"
    "anyio"
    "pillow"
    "trio"
    "quart-trio"
    "quart"
    "openpyxl"
    "python-docx"
    "python-pptx"
    "pypdf"
    "pymupdf"
    "odfpy"
    "zstandard"
    "pyautogui"
    "python-xlib"
    "pytest"
    "pytest-trio"
    "hypothesis"
  ];

  base =
    final:
    let
      python3Packages =
        lib.genAttrs pythonNames stub
        // {
          ray = stub "ray" // {
            optional-dependencies.default = [ ];
          };
          hypercorn = stub "hypercorn" // {
            optional-dependencies.trio = [ python3Packages.trio ];
          };
          # nixpkgs 25.11's python3.
          python = stub "python3" // {
            version = "3.13.9";
          };
          buildPythonPackage =
            args:
            assert args.pyproject or false || args.format or "" == "wheel";
            assert force (args.dependencies ++ args.build-system or [ ]);
            mkPkg (args // { name = "python3-${args.pname}-${args.version}"; });
          buildPythonApplication = python3Packages.buildPythonPackage;
        };
    in
    {
      inherit lib python3Packages;
      pkgs = final;
      callPackage =
        fn: overrides:
        let
          f = if builtins.isFunction fn then fn else import fn;
        in
        f (builtins.intersectAttrs (builtins.functionArgs f) final // overrides);

      criu = mkPkg {
        pname = "criu";
        version = "4.1.1";
        postPatch = ''substituteInPlace ./Makefile --replace-fail "head-name := x" "head-name = 4.1.1.0"'';
        makeFlags = [ "PREFIX=$(out)" ]; # nixpkgs' list (with ASCIIDOC= and XMLTO= there)
        passthru = { };
      };
      stdenv = stub "stdenv" // {
        cc.cc.lib = stub "gcc-lib";
        hostPlatform.parsed.cpu.name = builtins.head (lib.splitString "-" system);
        hostPlatform.system = system;
        mkDerivation =
          args:
          assert builtins.isString (args.buildPhase or args.buildCommand or "");
          assert builtins.isString (args.installCheckPhase or "");
          # passthru attributes are the result's, as nixpkgs' mkDerivation makes them.
          mkPkg (args // args.passthru or { } // { name = args.name or "${args.pname}-${args.version}"; });
      };
      # The image build runs in a VM: the stand-in forces the build script (every interpolated
      # fetch, file and list) and needs a disk image made before the VM starts.
      vmTools = {
        runInLinuxVM =
          drv:
          assert builtins.isString drv.buildCommand;
          assert drv ? preVM;
          drv;
        createEmptyImage =
          { size, fullName }:
          assert builtins.isInt size;
          "create-empty-image-${fullName}";
      };
      writeText =
        name: text:
        assert builtins.isString text;
        mkPkg { inherit name; };
      python311 = stub "python3" // {
        version = "3.11.14";
      };
      fetchurl =
        {
          url,
          sha256,
          name ? baseNameOf url,
        }:
        assert builtins.match "[0-9a-f]{64}" sha256 != null;
        mkPkg {
          inherit name url sha256;
        };
      fetchFromGitHub =
        {
          owner,
          repo,
          rev,
          hash,
        }:
        assert sri hash;
        assert builtins.match "[0-9a-f]{40}" rev != null;
        mkPkg {
          name = "source";
          inherit owner repo rev hash;
        };
      fetchzip =
        { url, hash, ... }:
        assert sri hash;
        mkPkg {
          name = "source";
          inherit url hash;
        };

      python3 = stub "python3" // {
        withPackages = f: assert force (f python3Packages); stub "python3-env";
      };
      buildEnv =
        { name, paths, ... }:
        assert force paths;
        mkPkg { inherit name; };
      closureInfo =
        { rootPaths }:
        assert force rootPaths;
        mkPkg { name = "closure-info"; };
      makeFontsConf =
        { fontDirectories }:
        assert force fontDirectories;
        mkPkg { name = "fonts.conf"; };
      runCommand =
        name: env: script:
        assert builtins.isString script;
        mkPkg (env // { inherit name; });
      mkShell =
        args:
        assert force (args.inputsFrom or [ ] ++ args.packages or [ ]);
        mkPkg { name = "shell"; };
      testers.runNixOSTest =
        args:
        let
          nodes.machine.services.drumsd = {
            configFile = "/nix/store/00000000000000000000000000000000-drumsd.json";
            tokenFile = "/var/lib/drums/token";
            settings = {
              state_dir = "/run/drums";
              journal_dir = "/var/lib/drums/journal";
            };
          };
          script = args.testScript { inherit nodes; };
        in
        assert builtins.isFunction args.nodes.machine;
        assert builtins.isString script;
        mkPkg { name = "vm-test-run-${args.name}"; };

      xvfb = stub "xvfb";
      xorg = lib.genAttrs [
        "xorgserver"
        "xwininfo"
        "xprop"
        "xrandr"
        "xset"
        "xrdb"
      ] stub;
      glib = stub "glib" // {
        bin = stub "glib-bin";
      };
    }
    // lib.genAttrs [
      "bashInteractive"
      "coreutils"
      "findutils"
      "gnugrep"
      "gnused"
      "less"
      "procps"
      "psmisc"
      "iproute2"
      "lxcfs"
      "cacert"
      "openbox"
      "xterm"
      "xdotool"
      "xclip"
      "scrot"
      "dbus"
      "dconf"
      "dejavu_fonts"
      "gnutar"
      "uv"
      "ruff"
      "nixfmt"
      "curl"
      "util-linux"
      "autoPatchelfHook"
      "zlib"
      "debootstrap"
      "e2fsprogs"
      "diffutils"
    ] stub;

  apply = overlay: prevSet: final: prevSet final // overlay final (prevSet final);
  composed = builtins.foldl' (acc: overlay: apply overlay acc) base overlays;
  fix = f: let x = f x; in x;
in
fix composed
