# What one desktop image profile installs, read from nix/images.lock.json (written by
# nix/lock_images.py from drumsd's image recipes and bookworm's package index): every .deb as a
# fixed-output fetch (the pool URL with the index's sha256), the package index a local
# repository of exactly those files needs, the pip files, and the recipe (files, setup script,
# desktop user, allowed device nodes). nix/debian-image.nix builds the image from it.
{
  lib,
  fetchurl,
  lockFile ? ./images.lock.json,
}:
let
  lock = lib.importJSON lockFile;
in
{
  profile,
  arch,
}:
let
  recipe =
    lock.profiles.${profile}
      or (throw "nix/images.lock.json has no profile ${profile} (it has: ${lib.concatStringsSep ", " (lib.attrNames lock.profiles)})");
  closure =
    recipe.closure.${arch}
      or (throw "nix/images.lock.json has no ${arch} packages for ${profile}; run nix/lock_images.py --arch ${arch}");
  index = lock.debs.${arch};
  names = lib.sort (a: b: a < b) (lib.unique (closure.bootstrap ++ closure.apt));
  entry = name: index.${name} // { inherit name; };
  # The Packages stanza of one locked .deb: its name, the fields nix/lock_images.py kept (in
  # key order, as the lock's JSON has them), the pool path, size and hash last (as
  # lock_images.index_stanza writes it).
  stanza =
    e:
    lib.concatStrings (
      [ "Package: ${e.name}\n" ]
      ++ lib.mapAttrsToList (k: v: "${k}: ${v}\n") e.control
      ++ [
        "Version: ${e.version}\n"
        "Architecture: ${e.architecture}\n"
        "Filename: ${e.filename}\n"
        "Size: ${toString e.size}\n"
        "SHA256: ${e.sha256}\n"
      ]
    );
  fetchDeb =
    e:
    fetchurl {
      url = "${lock.mirror}/${e.filename}";
      inherit (e) sha256;
      # Pool names may hold `~` or `%3a`, which store paths cannot.
      name = lib.strings.sanitizeDerivationName "${e.name}_${e.version}_${e.architecture}.deb";
    };
  debs = map (
    name:
    let
      e = entry name;
    in
    {
      inherit (e)
        name
        version
        architecture
        filename
        sha256
        size
        ;
      deb = fetchDeb e;
    }
  ) names;
in
{
  inherit (lock)
    suite
    mirror
    component
    user
    devices
    builder_version
    ;
  inherit profile arch debs;
  release = lock.release.${arch};
  inherit (recipe) packages files setup;
  bootstrap = closure.bootstrap;
  # debootstrap's set is taken from the index by Priority (minbase: `required` and apt), so the
  # local index must hold that set; the apt step names the profile's packages.
  packagesIndex = lib.concatMapStringsSep "\n" (name: stanza (entry name)) names;
  # "name version" of every package, sorted: the image build compares dpkg's list with it.
  manifest = lib.concatMapStrings (e: "${e.name} ${e.version}\n") (
    lib.sort (a: b: a.name < b.name) (map entry names)
  );
  pipFiles = map (p: {
    inherit (p) name version;
    # pip reads a wheel's tags from its file name: the build copies it back under this name.
    fileName = baseNameOf p.url;
    file = fetchurl {
      inherit (p) url sha256;
    };
  }) recipe.pip_files;
}
