# services.drumsd: the drums host daemon (CRIU-restored Linux desktops) as a NixOS service.
#
# Settings follow RFC 42: `settings` is the daemon's JSON config file. Its typed options and their
# defaults are generated from drumsd's config model (./drumsd-settings.nix, by
# nix/generate_settings_options.py); anything else is freeform and still checked at build time by
# `drumsd check-config`, which names any unknown key.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.drumsd;
  jsonFormat = pkgs.formats.json { };

  settingsOptions = import ./drumsd-settings.nix { inherit lib jsonFormat; };

  # The listen port, for the firewall; `listen` is host:port (IPv6 as [::1]:7070).
  listenParts = lib.splitString ":" cfg.settings.listen;
  listenPort = lib.toInt (lib.last listenParts);
  listenHost = lib.removeSuffix ":${lib.last listenParts}" cfg.settings.listen;
  loopbackHosts = [
    "127.0.0.1"
    "localhost"
    "[::1]"
    "::1"
  ];
  listenIsLoopback = lib.elem listenHost loopbackHosts || lib.hasPrefix "127." listenHost;

  isStorePath = p: lib.hasPrefix "${builtins.storeDir}/" (toString p);

  unvalidatedConfig = jsonFormat.generate "drumsd-unchecked.json" cfg.settings;

  # Like the prometheus module's promtool check: the daemon itself validates the file at build
  # time, so a typo in `settings` fails `nixos-rebuild` instead of the service at boot.
  configFile =
    pkgs.runCommand "drumsd.json"
      {
        nativeBuildInputs = [ cfg.package ];
        preferLocalBuild = true;
      }
      ''
        if ! drumsd check-config ${unvalidatedConfig} > check.out 2>&1; then
          cat check.out >&2
          echo "services.drumsd.settings: drumsd check-config rejected the generated config;" \
            "fix the keys named above" >&2
          exit 1
        fi
        cp ${unvalidatedConfig} $out
      '';

  # The token is made on the host at first start, never in the store (the store is
  # world-readable). umask 077 makes it 0600 from its first byte; mv makes it appear whole.
  ensureToken = pkgs.writeShellScript "drumsd-ensure-token" ''
    set -eu
    umask 077
    token=${lib.escapeShellArg cfg.tokenFile}
    if [ ! -e "$token" ]; then
      mkdir -p "$(dirname "$token")"
      tmp="$(mktemp "$token.XXXXXX")"
      head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp"
      mv "$tmp" "$token"
      echo "drumsd: created a new API token in $token (mode 0600)"
    fi
  '';

  stateDir = cfg.settings.state_dir;

  # The state tmpfs's size in MiB when it is absolute (a tmpfs `size=`: bytes or k/m/g); null for
  # a share of RAM, which only the booted host knows.
  stateTmpfsMiB =
    let
      parts = builtins.match "([0-9]+)([kKmMgG]?)" cfg.stateTmpfsSize;
      n = lib.toInt (builtins.head parts);
      unit = lib.toLower (builtins.elemAt parts 1);
    in
    if parts == null then
      null
    else
      {
        g = n * 1024;
        m = n;
        k = n / 1024;
        "" = n / 1048576;
      }
      .${unit};
  admission = cfg.settings.admission;

  # Above NixOS's mkDefault (1000), below a plain definition (100); see boot.kernel.sysctl.
  sysctlPriority = 999;

  # Nix images are unpacked where drumsd looks for built images: <images_dir>/<profile>-<hash>/
  # with root/ and an image.json carrying the sha256 drumsd's own manifest function computes,
  # so the daemon finds them by profile exactly like images it built itself. One directory per
  # store path: a new image never changes a root that checkpoints still use. drumsd itself does
  # it (`drumsd image unpack`), through its own bin/drumsd: the module needs nothing of how the
  # package was built (nixpkgs' buildPythonApplication exposes no interpreter or site-packages).
  nixImagesDir = "/var/lib/drums/nix-images";
  imageProfile = if cfg.image == null then "base" else cfg.image.profile or "base";
  imageName = builtins.substring 0 32 (baseNameOf (toString cfg.image));
  unpackImage = lib.escapeShellArgs [
    (lib.getExe' cfg.package "drumsd")
    "image"
    "unpack"
    "${toString cfg.image}/root.tar"
    "--profile"
    imageProfile
    "--name"
    imageName
    "--images-dir"
    nixImagesDir
  ];
in
{
  options.services.drumsd = {
    enable = lib.mkEnableOption "drumsd, the drums host daemon of CRIU-restored Linux desktops";

    package = lib.mkOption {
      type = lib.types.package;
      default =
        pkgs.drumsd
          or (throw "services.drumsd.package: pkgs.drumsd does not exist; add drums' overlay (nixpkgs.overlays = [ drums.overlays.default ]) or set services.drumsd.package");
      defaultText = lib.literalExpression "pkgs.drumsd";
      description = "The drumsd package (its `drumsd` command serves and checks the config).";
    };

    criuPackage = lib.mkOption {
      type = lib.types.package;
      default =
        pkgs.drums-criu
          or (throw "services.drumsd.criuPackage: pkgs.drums-criu does not exist; add drums' overlay or set services.drumsd.criuPackage to a CRIU >= 4.2");
      defaultText = lib.literalExpression "pkgs.drums-criu";
      description = ''
        CRIU used for every dump and restore. It must be 4.2 or newer: 4.1 cannot dump TCP/UDP
        sockets on Linux >= 6.16. Wired in as `settings.criu` and put on the unit's PATH.
      '';
    };

    image = lib.mkOption {
      type = lib.types.nullOr lib.types.package;
      default = pkgs.drums-image-base or null;
      defaultText = lib.literalExpression "pkgs.drums-image-base";
      description = ''
        The desktop image: a package with `root.tar` and a `profile` attribute: the locked
        Debian images `pkgs.drums-image-base` (the default), `-office` or `-osworld`
        (nix/debian-image.nix: exactly the packages of the lock `drumsd image build` installs
        from), or your own of that shape; unpacked once by drumsd-image.service into
        /var/lib/drums/nix-images/<profile>-<hash>/root (tar keeps the owners the store cannot),
        with the image.json drumsd reads; the lower layer of every slot. Wired in as
        `settings.images_dir` and `settings.default_image`. null leaves images to you
        (`settings.lower` or `drumsd image build`).
      '';
    };

    osworldTasks = lib.mkOption {
      type = lib.types.nullOr lib.types.package;
      default =
        let
          pin = cfg.settings.tasks.osworld;
        in
        if pin.commit != null && pin.sha256 != null then
          (pkgs.drums-osworld-tasks
            or (throw "services.drumsd.osworldTasks: pkgs.drums-osworld-tasks does not exist; add drums' overlay or set services.drumsd.osworldTasks")
          )
            {
              inherit (pin) repository commit sha256;
            }
        else
          null;
      defaultText = lib.literalMD "OSWorld's task files at `settings.tasks.osworld.commit`, fetched by Nix and checked against `settings.tasks.osworld.sha256`, when both are set; else null";
      description = ''
        OSWorld's task files as a package with `examples/` (nix/osworld-tasks.nix: the pinned
        commit's tarball, checked against the pin's sha256 by a fixed-output fetch, only
        evaluation_examples/examples kept). Wired in as `settings.tasks.osworld.dir`, so the
        daemon serves them without fetching anything at run time. null: the daemon's own
        `drumsd tasks fetch-osworld` (or a `dir` you set).
      '';
    };

    checkerVenv = lib.mkOption {
      type = lib.types.nullOr lib.types.package;
      default = null;
      example = lib.literalExpression "pkgs.drums-checker-venv";
      description = ''
        The checker venv OSWorld's metrics run in, built by Nix from nix/checker-venv.lock.json
        (`pkgs.drums-checker-venv`, x86_64). Wired in as `settings.tasks.checker_venv`. null:
        drumsd builds it with pip at first use, from the network.
      '';
    };

    tokenFile = lib.mkOption {
      type = lib.types.pathWith {
        inStore = false;
        absolute = true;
      };
      default = "/var/lib/drums/token";
      description = ''
        File holding the API bearer token (32+ characters, mode 0600). Created with a random
        token at first start if absent. Never a store path: the store is world-readable.
      '';
    };

    stateTmpfsSize = lib.mkOption {
      type = lib.types.strMatching "[0-9]+[kKmMgG%]?";
      default = "50%";
      example = "16G";
      description = ''
        Size of the tmpfs mounted at `settings.state_dir` that holds the slots' upper layers and
        checkpoints (a tmpfs `size=` value: bytes, k/m/g suffix, or % of RAM).
      '';
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Open the API port of `settings.listen` in the firewall. Needs a non-loopback `listen`
        and `settings.allow_remote = true`; put TLS in front of the daemon.
      '';
    };

    ray = {
      enable = lib.mkEnableOption "joining this host's drumsd to a Ray pool (`drums pool join`, a unit after drumsd)";

      package = lib.mkOption {
        type = lib.types.package;
        default =
          pkgs.drums-pool
            or (throw "services.drumsd.ray.package: pkgs.drums-pool does not exist; add drums' overlay or set services.drumsd.ray.package");
        defaultText = lib.literalExpression "pkgs.drums-pool";
        description = ''
          The package whose `drums` command runs `drums pool join`: the SDK with its `ray`
          extra importable (drums' overlay's `drums-pool`, a Python environment; docs/pool.md).
        '';
      };

      address = lib.mkOption {
        type = lib.types.strMatching ".+:[0-9]+";
        example = "10.0.0.1:6379";
        description = "The Ray head to join, host:port (`drums pool join --address`).";
      };

      nodeLabel = lib.mkOption {
        type = lib.types.strMatching "[A-Za-z0-9._-]+";
        default = config.networking.hostName;
        defaultText = lib.literalExpression "config.networking.hostName";
        description = "This host's name in the pool (`--node-label`); the host name by default.";
      };

      extraArgs = lib.mkOption {
        type = lib.types.listOf lib.types.str;
        default = [ ];
        example = [ "--log-level" "debug" ];
        description = "More arguments to `drums pool join`, after the module's own.";
      };
    };

    settings = lib.mkOption {
      default = { };
      description = ''
        drumsd's config file (`drumsd serve --config`), as Nix. Typed options carry the config
        model's defaults; other keys pass through and are validated at build time.
      '';
      type = lib.types.submodule {
        freeformType = jsonFormat.type;
        options = settingsOptions;
      };
    };

    configFile = lib.mkOption {
      type = lib.types.path;
      readOnly = true;
      default = configFile;
      defaultText = lib.literalMD "the checked JSON rendering of `settings`";
      description = "The generated and `check-config`-validated config file.";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = !isStorePath cfg.tokenFile;
        message = "services.drumsd.tokenFile (${toString cfg.tokenFile}) is in the Nix store, which every user can read; use a path such as /var/lib/drums/token.";
      }
      {
        assertion = lib.versionAtLeast (lib.getVersion cfg.criuPackage) "4.2";
        message = "services.drumsd.criuPackage is CRIU ${lib.getVersion cfg.criuPackage}; drums needs >= 4.2 (4.1 cannot dump sockets on Linux >= 6.16). Use pkgs.drums-criu from drums' overlay.";
      }
      {
        assertion = listenIsLoopback || cfg.settings.allow_remote;
        message = "services.drumsd.settings.listen = \"${cfg.settings.listen}\" is not loopback; set services.drumsd.settings.allow_remote = true (and put TLS in front) to serve other hosts.";
      }
      {
        assertion = !cfg.openFirewall || !listenIsLoopback;
        message = "services.drumsd.openFirewall opens port ${toString listenPort}, but settings.listen (${cfg.settings.listen}) is loopback; listen on an external address with allow_remote = true, or leave openFirewall off.";
      }
      {
        # A fork or capture writes a checkpoint, then must leave min_state_free_mib: on a smaller
        # tmpfs admission refuses every one of them (429), and creates too once a template exists.
        assertion =
          stateTmpfsMiB == null
          || !admission.enabled
          || admission.min_state_free_mib + admission.capture_mib < stateTmpfsMiB;
        message = "services.drumsd.stateTmpfsSize (${cfg.stateTmpfsSize}) leaves no room: admission refuses an operation that would leave less than settings.admission.min_state_free_mib (${toString admission.min_state_free_mib} MiB) after a checkpoint of settings.admission.capture_mib (${toString admission.capture_mib} MiB). Make the tmpfs larger or lower those two.";
      }
      {
        assertion = lib.hasPrefix "/" stateDir && !isStorePath stateDir;
        message = "services.drumsd.settings.state_dir (${stateDir}) must be an absolute path outside the Nix store: a tmpfs is mounted there.";
      }
      {
        assertion = !lib.hasPrefix "${stateDir}/" "${cfg.settings.journal_dir}/";
        message = "services.drumsd.settings.journal_dir (${cfg.settings.journal_dir}) is inside state_dir (${stateDir}), a tmpfs: the journal must outlive a reboot. Put it under /var/lib.";
      }
    ];

    # Paths the module owns: mkDefault so a user's own setting still wins.
    services.drumsd.settings = {
      token_file = toString cfg.tokenFile;
      criu = lib.mkDefault "${cfg.criuPackage}/bin/criu";
      images_dir = lib.mkIf (cfg.image != null) (lib.mkDefault nixImagesDir);
      default_image = lib.mkIf (cfg.image != null) (lib.mkDefault imageProfile);
      tasks.osworld.dir = lib.mkIf (cfg.osworldTasks != null) (
        lib.mkDefault "${cfg.osworldTasks}/examples"
      );
      tasks.checker_venv = lib.mkIf (cfg.checkerVenv != null) (lib.mkDefault "${cfg.checkerVenv}");
    };

    environment.systemPackages = [
      cfg.package
      cfg.criuPackage
    ];

    # Linux >= 4.19 in nixpkgs always has CHECKPOINT_RESTORE; the feature flag states the need
    # (and turns it on for older kernels), as nixpkgs' programs.criu does.
    boot.kernel.features.criu = true;
    boot.kernelModules = [ "overlay" ];
    # PSI feeds admission control (memory some avg10); explicit in case a kernel defaults it off.
    # cgroup_no_v1=all: every controller stays on the unified (v2) hierarchy drumsd delegates
    # from; nothing can claim memory, cpu or pids for a v1 mount.
    boot.kernelParams = [
      "psi=1"
      "cgroup_no_v1=all"
    ];
    # NixOS types each sysctl as one value merged like mergeOneOption: two definitions at the same
    # priority fail evaluation even when equal, and NixOS itself sets some of these at mkDefault
    # (1000): systemd.nix sets kernel.pid_max on 64-bit hosts, xserver.nix (and newer NixOS's
    # sysctl.nix) the inotify limits to 524288. So the module defines them at sysctlPriority
    # (999): it wins over NixOS's defaults without a conflict, and a host's plain definition
    # (100) or mkForce still wins over the module. No value is below what NixOS would set.
    boot.kernel.sysctl = {
      # Every desktop runs Xvfb, a window manager and apps, each holding inotify instances; the
      # kernel's default of 128 per user stops desktops from the second or third one.
      "fs.inotify.max_user_instances" = lib.mkOverride sysctlPriority 524288;
      # Their watches add up across hundreds of desktops (the kernel default scales with RAM).
      "fs.inotify.max_user_watches" = lib.mkOverride sysctlPriority 1048576;
      # Each restored tree brings its own pid namespace and tens of processes; CRIU restores
      # them with their dumped pids, so the host's pid space must be the kernel's maximum.
      "kernel.pid_max" = lib.mkOverride sysctlPriority 4194304;
    };

    # KSM merges identical pages of restored desktops (about 77% measured); drumsd opts the
    # criu process in with PR_SET_MEMORY_MERGE, the kernel's scanner must run.
    hardware.ksm = lib.mkIf cfg.settings.ksm.enabled {
      enable = true;
      sleep = lib.mkDefault cfg.settings.ksm.sleep_millisecs;
    };

    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ listenPort ];

    # The slots' upper layers and checkpoints live on this tmpfs. It is a separate mount unit, not
    # the service's: a daemon crash or restart keeps it, and the restarted daemon adopts slots.
    systemd.mounts = [
      {
        description = "drumsd slot state (tmpfs)";
        what = "tmpfs";
        where = stateDir;
        type = "tmpfs";
        options = "mode=0700,size=${cfg.stateTmpfsSize}";
      }
    ];

    systemd.tmpfiles.settings."10-drumsd" =
      lib.genAttrs
        [
          cfg.settings.journal_dir
          cfg.settings.forgotten_dir
          cfg.settings.images_dir
          cfg.settings.tasks.cache_dir
          (dirOf (toString cfg.tokenFile))
        ]
        (_: {
          d = {
            mode = "0700";
            user = "root";
            group = "root";
          };
        });

    systemd.services.drumsd-image = lib.mkIf (cfg.image != null) {
      description = "Unpack the drums desktop image into the slots' lower layer";
      before = [ "drumsd.service" ];
      requiredBy = [ "drumsd.service" ];
      path = [
        pkgs.gnutar
        pkgs.coreutils
      ];
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
        ExecStart = unpackImage;
      };
    };

    # Joins the pool once the daemon runs; --block keeps it in the foreground, so systemd sees
    # the membership end and restarts it. Stopped with drumsd (partOf), started after it.
    systemd.services.drumsd-ray = lib.mkIf cfg.ray.enable {
      description = "Join drumsd to the Ray pool at ${cfg.ray.address}";
      wantedBy = [ "multi-user.target" ];
      after = [
        "drumsd.service"
        "network-online.target"
      ];
      wants = [ "network-online.target" ];
      requires = [ "drumsd.service" ];
      partOf = [ "drumsd.service" ];
      serviceConfig = {
        Type = "exec";
        ExecStart = lib.escapeShellArgs (
          [
            (lib.getExe' cfg.ray.package "drums")
            "pool"
            "join"
            "--address"
            cfg.ray.address
            "--node-label"
            cfg.ray.nodeLabel
            "--block"
          ]
          ++ cfg.ray.extraArgs
        );
        Restart = "on-failure";
        RestartSec = "5s";
      };
    };

    systemd.services.drumsd = {
      description = "drums host daemon (CRIU-restored desktops)";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ] ++ lib.optional (cfg.image != null) "drumsd-image.service";
      unitConfig.RequiresMountsFor = [
        stateDir
        cfg.settings.journal_dir
      ];
      # CRIU and the tools the runtime shells out to, like incus puts criu on its PATH.
      path = [
        cfg.criuPackage
        pkgs.util-linux
        pkgs.iproute2
        pkgs.coreutils
        pkgs.procps
      ]
      # The per-slot /proc view (settings.procview_dir) is LXCFS, which drumsd starts from its
      # PATH (`lxcfs`), and a preloaded sysinfo() library drumsd compiles at start with `cc`;
      # only then, so the default closure carries neither (nor FUSE).
      ++ lib.optionals ((cfg.settings.procview_dir or null) != null) [
        pkgs.lxcfs
        pkgs.stdenv.cc
      ];
      restartTriggers = [ configFile ];
      serviceConfig = {
        Type = "exec";
        ExecStartPre = [ ensureToken ];
        ExecStart = "${lib.getExe' cfg.package "drumsd"} serve --config ${configFile}";
        Restart = "on-failure";
        RestartSec = "2s";
        # drumsd manages the cgroups of its slots itself, below its own (cgroup v2 delegation).
        Delegate = "yes";
        # systemd (>= 254) starts the daemon in drumsd.service/daemon, a leaf: the unit's own
        # cgroup then has no processes and may hold the slots' groups (cgroup v2's
        # no-internal-processes rule), and a restart after a crash can attach the new daemon
        # even though the slots' groups are still there (KillMode=process keeps them).
        DelegateSubgroup = "daemon";
        # Only the daemon is stopped with the unit; slots in the delegated subtree keep running
        # and the restarted daemon adopts or cleans them (journal reconcile). SIGTERM drains.
        KillMode = "process";
        TimeoutStopSec = "30s";
        # Hundreds of desktops: their processes are counted below this unit.
        TasksMax = "infinity";
        # CRIU restores processes with many open files.
        LimitNOFILE = 1048576;
        # New files (journal records, checkpoints) are private to root.
        UMask = "0077";
        # Hardening that is deliberately NOT set (each would break slots; see docs/nix.md):
        # any option that gives the unit a private mount namespace (ProtectSystem, ProtectHome,
        # PrivateTmp, PrivateDevices, ProtectKernel*, ReadWritePaths): slot mounts must live in
        # the host namespace so a restarted daemon sees and cleans them. Seccomp-based options
        # (SystemCallFilter, LockPersonality, MemoryDenyWriteExecute, RestrictNamespaces,
        # RestrictRealtime, RestrictSUIDSGID, ProtectHostname, ProtectClock): filters are
        # inherited by every restored desktop, and CRIU itself needs ptrace, clone3 with
        # namespaces, personality and executable mappings. NoNewPrivileges: inherited by slots
        # and irreversible. CapabilityBoundingSet: CRIU restores the dumped capability sets
        # and fails when the bounding set lacks one. DevicePolicy: slots mknod their /dev.
      };
    };
  };
}
