# The `base` desktop image as a Nix-built root for the slots' lower layer: the closure of the
# desktop's packages copied under root/nix/store, FHS links into it, the desktop user, and the
# guest agent at /opt/drums/guest (the layout drumsd.linux.image gives debootstrap'd images).
#
# The store cannot record file owners, so the result is a tarball with owners set by tar
# ($out/root.tar: root-owned system, /home/user owned by uid 1000, sticky /tmp); the NixOS module
# unpacks it once per image into /var/lib/drums/nix-images/<hash>/root (drumsd-image.service).
{
  lib,
  pkgs,
  guestSrc,
}:
let
  desktopUser = "user";
  desktopUid = 1000;

  # nixpkgs moved Xvfb out of xorgserver into its own package; take whichever this pin has.
  xvfb = pkgs.xvfb or pkgs.xorg.xorgserver;

  python = pkgs.python3.withPackages (ps: [
    ps.pillow
    ps.pyautogui
    ps.python-xlib
  ]);

  fontsConf = pkgs.makeFontsConf { fontDirectories = [ pkgs.dejavu_fonts ]; };

  desktopEnv = pkgs.buildEnv {
    name = "drums-desktop-env";
    paths = [
      pkgs.bashInteractive
      pkgs.coreutils
      pkgs.findutils
      pkgs.gnugrep
      pkgs.gnused
      pkgs.less
      pkgs.procps
      pkgs.psmisc
      pkgs.iproute2
      pkgs.cacert
      xvfb
      pkgs.openbox
      pkgs.xterm
      pkgs.xdotool
      pkgs.xclip
      pkgs.scrot
      pkgs.xorg.xwininfo
      pkgs.xorg.xprop
      pkgs.xorg.xrandr
      pkgs.xorg.xset
      # The guest init merges xterm's print resources with xrdb (Debian's x11-xserver-utils).
      pkgs.xorg.xrdb
      pkgs.dbus
      pkgs.dconf
      pkgs.glib.bin
      pkgs.dejavu_fonts
      python
    ];
    pathsToLink = [
      "/bin"
      "/share"
      "/etc"
    ];
  };

  closure = pkgs.closureInfo {
    rootPaths = [
      desktopEnv
      fontsConf
    ];
  };

  guestEntry = module: ''
    #!/usr/bin/python3 -I
    # drums guest entry point (written by nix/desktop-image.nix).
    import sys
    sys.path.insert(0, '/opt/drums/guest')
    from drums_guest.${module} import main
    sys.exit(main())
  '';

  passwd = ''
    root:x:0:0:root:/root:/bin/bash
    ${desktopUser}:x:${toString desktopUid}:${toString desktopUid}::/home/${desktopUser}:/bin/bash
    nobody:x:65534:65534:nobody:/nonexistent:/bin/false
  '';
  group = ''
    root:x:0:
    ${desktopUser}:x:${toString desktopUid}:
    nogroup:x:65534:
  '';
in
pkgs.runCommand "drums-desktop-image-base"
  {
    nativeBuildInputs = [ pkgs.gnutar ];
    passthru = {
      inherit desktopEnv python closure;
      profile = "base";
    };
    meta = {
      description = "drums `base` desktop image (Xvfb, openbox, xterm, xdotool, python3 + pyautogui, guest agent) as a root tarball";
      platforms = lib.platforms.linux;
    };
  }
  ''
    root=$PWD/root
    mkdir -p $root/nix/store $root/etc/fonts $root/usr $root/opt/drums/guest \
      $root/home/${desktopUser} $root/root $root/tmp $root/var/tmp $root/var/log $root/run \
      $root/dev $root/proc $root/sys
    while read -r path; do
      cp -a "$path" $root/nix/store/
    done < ${closure}/store-paths
    chmod -R u+w $root/nix/store

    # FHS entry points into the environment (resolved inside the slot's own root).
    ln -s ${desktopEnv}/bin $root/bin
    ln -s ${desktopEnv}/bin $root/usr/bin
    ln -s ${desktopEnv}/bin $root/sbin
    ln -s ${desktopEnv}/share $root/usr/share
    ln -s ${fontsConf} $root/etc/fonts/fonts.conf
    ln -s ${pkgs.cacert}/etc/ssl $root/etc/ssl

    printf '%s' ${lib.escapeShellArg passwd} > $root/etc/passwd
    printf '%s' ${lib.escapeShellArg group} > $root/etc/group
    echo drums > $root/etc/hostname
    : > $root/etc/machine-id
    : > $root/etc/resolv.conf
    echo 'hosts: files' > $root/etc/nsswitch.conf

    for d in Desktop Documents Downloads Pictures Music Videos .config .cache; do
      mkdir -p $root/home/${desktopUser}/$d
    done

    cp -r ${guestSrc} $root/opt/drums/guest/drums_guest
    chmod -R u+w $root/opt/drums/guest
    find $root/opt/drums/guest -name __pycache__ -prune -exec rm -rf {} +
    ${lib.concatMapStrings (
      pair:
      let
        entry = builtins.elemAt pair 0;
        module = builtins.elemAt pair 1;
      in
      ''
        printf '%s' ${lib.escapeShellArg (guestEntry module)} > $root/opt/drums/guest/${entry}
        chmod 0755 $root/opt/drums/guest/${entry}
      ''
    ) [ [ "desktop-init" "init" ] [ "agent" "agent" ] [ "worker" "worker" ] ]}

    mkdir -p $out
    common="--sort=name --mtime=@1 --numeric-owner --format=gnu"
    tar -C $root $common --owner=0 --group=0 --mode=go-w \
      --exclude=./home/${desktopUser} --exclude=./tmp --exclude=./var/tmp \
      -cf $out/root.tar .
    tar -C $root $common --owner=${toString desktopUid} --group=${toString desktopUid} \
      --mode=u+rwX,go-w -rf $out/root.tar ./home/${desktopUser}
    tar -C $root $common --owner=0 --group=0 --mode=1777 \
      --no-recursion -rf $out/root.tar ./tmp ./var/tmp

    cat > $out/image.json <<JSON
    {"profile": "base", "builder": "nix", "env": "${desktopEnv}", "user": ["${desktopUser}", ${toString desktopUid}]}
    JSON
  ''
