# CRIU 4.2.1 on top of nixpkgs' criu derivation (the build recipe stays nixpkgs'; the source and
# the patches change). 4.2.1 is the first release that dumps TCP/UDP sockets on Linux >= 6.16,
# and the version proven to checkpoint and restore drums desktops (see docs/nix.md, "CRIU").
{ criu, fetchzip }:
criu.overrideAttrs (
  old:
  let
    version = "4.2.1";
  in
  {
    inherit version;
    # The tag's source archive from the CRIU project's GitHub release v4.2.1. The hash is the NAR
    # hash of the unpacked tree (what fetchzip checks), computed on a drums host from Debian's
    # criu_4.2.1.orig.tar.xz, whose file sha256 29ec0ee0...19f6725b9 matches sid's .dsc. It
    # equals this archive's tree only if Debian's orig tarball is that archive recompressed,
    # which is how Debian's watch file fetches it; docs/nix.md says what was verified where.
    src = fetchzip {
      url = "https://github.com/checkpoint-restore/criu/archive/refs/tags/v${version}.tar.gz";
      hash = "sha256-Njk3RNxmKiFEu5nnVuY16XaJQxkgBL2hf7YU5XFh67Y=";
    };
    # drums' one patch, the file host preparation applies too (it replaces nixpkgs' patches,
    # backports 4.2.1 already has): `criu dump --track-mem-uffd-wp` reads which pages were
    # written since drumsd write-protected them (a WP_ASYNC userfaultfd; PAGEMAP_SCAN) and dumps
    # the others as in-parent holes: incremental dumps on kernels without soft-dirty tracking.
    patches = [ ../drumsd/src/drumsd/linux/criu-track-mem-uffd-wp.patch ];
    # Its kerndat cache (what it learnt of the kernel, ~30 ms a run to probe again) in a dir
    # drumsd keeps on a tmpfs whatever /run is: hostprep's CRIU_MAKE_VARS, the same value.
    makeFlags = (old.makeFlags or [ ]) ++ [ "RUNDIR=/dev/shm/drums-criu" ];
    # nixpkgs' postPatch bakes its own version into the Makefile's head-name; keep ours. Its
    # other edits still apply: Documentation/Makefile's `2>/dev/null` and `-m custom.xsl`, the
    # Makefile's head-name line and images/google/protobuf/ are all in the 4.2.1 tree.
    postPatch =
      builtins.replaceStrings [ "head-name = ${old.version}.0" ] [ "head-name = ${version}.0" ]
        (old.postPatch or "");
    passthru = (old.passthru or { }) // {
      # The Debian source tarball of the same release, for hosts that fetch from Debian mirrors
      # (flat sha256 of the file; verified on a drums host).
      debianOrigTarball = {
        url = "mirror://debian/pool/main/c/criu/criu_${version}.orig.tar.xz";
        hash = "sha256-KewO4J4pZHn+cEjICYDo7x0GhNCwIEwrEB3+oZ9nJbk=";
      };
    };
  }
)
