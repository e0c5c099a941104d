# The Python dependencies of the drums workspace as uv.lock pins them: every package at the
# locked version, fetched from the lock's URL with the lock's sha256. A wheel for this Python and
# machine when the lock has one (cpXY, then abi3, then pure), else the sdist. Markers are
# evaluated for the target (Linux, nixpkgs' CPython) as uv would; extras follow the lock.
# tests/nix/test_nix_uv_lock.py checks every URL and hash against uv.lock read by Python.
#
#   lockFor = import ./uv-lock.nix { inherit lib python3Packages fetchurl; };
#   lockFor.dependencies "drumsd"     -> the derivations drumsd needs at run time
#   lockFor.extra "drums-sdk" "ray"   -> those its `ray` extra adds
{
  lib,
  python3Packages,
  fetchurl,
  autoPatchelfHook,
  stdenv,
  zlib,
  lockFile ? ../uv.lock,
  machine ? stdenv.hostPlatform.parsed.cpu.name,
}:
let
  ps = python3Packages;
  python = ps.python;
  lock = builtins.fromTOML (builtins.readFile lockFile);

  # PEP 508 environment markers of the target.
  environment = {
    python_full_version = python.version;
    python_version = lib.versions.majorMinor python.version;
    implementation_name = "cpython";
    platform_python_implementation = "CPython";
    sys_platform = "linux";
    platform_system = "Linux";
    os_name = "posix";
    platform_machine = machine;
    extra = "";
  };
  versionMarkers = [
    "python_version"
    "python_full_version"
  ];
  compare =
    variable: op: value:
    let
      actual =
        environment.${variable} or (throw "uv.lock: marker variable `${variable}` is not known here");
      order = builtins.compareVersions actual value;
      wildcard = lib.hasSuffix ".*" value;
      prefixOf = lib.hasPrefix (lib.removeSuffix "*" value) "${actual}.";
    in
    if !(lib.elem variable versionMarkers) then
      (
        if op == "==" then
          actual == value
        else if op == "!=" then
          actual != value
        else
          throw "uv.lock: `${variable} ${op}` compares a string by order"
      )
    else if op == "==" then
      (if wildcard then prefixOf else order == 0)
    else if op == "!=" then
      (if wildcard then !prefixOf else order != 0)
    else if op == "<" then
      order < 0
    else if op == "<=" then
      order <= 0
    else if op == ">" then
      order > 0
    else if op == ">=" then
      order >= 0
    else
      throw "uv.lock: marker operator ${op} is not supported";

  # A marker is comparisons joined by `and`/`or` (and binds tighter) with parentheses: split into
  # tokens (a comparison is already a bool), then a recursive descent over the token list.
  comparison = "([a-z_]+) *(==|!=|<=|>=|<|>|~=) *'([^']*)'";
  tokensOf =
    marker:
    lib.concatMap (
      piece:
      if builtins.isList piece then
        [ (compare (builtins.elemAt piece 0) (builtins.elemAt piece 1) (builtins.elemAt piece 2)) ]
      else
        lib.concatMap (
          part:
          if builtins.isList part then
            part
          else if builtins.match " *" part != null then
            [ ]
          else
            throw "uv.lock: marker `${marker}` is not understood here (at `${part}`)"
        ) (builtins.split "(\\(|\\)|and|or)" piece)
    ) (builtins.split comparison marker);
  holds =
    marker:
    let
      tokens = tokensOf marker;
      count = builtins.length tokens;
      at = i: if i < count then builtins.elemAt tokens i else null;
      # Each parser returns { value; next; } from token index i.
      atom =
        i:
        if at i == "(" then
          let
            inner = disjunction (i + 1);
          in
          if at inner.next == ")" then
            {
              inherit (inner) value;
              next = inner.next + 1;
            }
          else
            throw "uv.lock: marker `${marker}` lacks a closing parenthesis"
        else if builtins.isBool (at i) then
          {
            value = at i;
            next = i + 1;
          }
        else
          throw "uv.lock: marker `${marker}` is not understood here";
      chain =
        operator: operand: combine: i:
        let
          first = operand i;
          step =
            acc:
            if at acc.next == operator then
              let
                rest = operand (acc.next + 1);
              in
              step {
                value = combine acc.value rest.value;
                inherit (rest) next;
              }
            else
              acc;
        in
        step first;
      conjunction = chain "and" atom (a: b: a && b);
      disjunction = chain "or" conjunction (a: b: a || b);
      result = disjunction 0;
    in
    if result.next == count then
      result.value
    else
      throw "uv.lock: marker `${marker}` has more after its end";
  applies = requirement: !(requirement ? marker) || holds requirement.marker;

  keyOf = p: "${p.name}==${p.version}";
  packages = lib.listToAttrs (map (p: lib.nameValuePair (keyOf p) p) lock.package);
  byName = lib.groupBy (p: p.name) lock.package;
  # A requirement names a version only where the lock holds several (per Python version).
  resolve =
    requirement:
    if requirement ? version then
      packages."${requirement.name}==${requirement.version}"
    else
      let
        candidates = byName.${requirement.name} or [ ];
      in
      if builtins.length candidates == 1 then
        builtins.head candidates
      else
        throw "uv.lock: ${requirement.name} is locked ${toString (builtins.length candidates)} times and the requirement names no version";

  # Wheel tags of this Python: cp313 and the like.
  cpTag = "cp" + builtins.replaceStrings [ "." ] [ "" ] environment.python_version;
  pyVersionTag = "py" + builtins.replaceStrings [ "." ] [ "" ] environment.python_version;
  minor = lib.toInt (lib.versions.minor python.version);
  platformOk =
    tag:
    tag == "any"
    || builtins.match "(many|musl)?linux.*_${machine}" tag != null && !(lib.hasPrefix "musl" tag);
  # 0: built for this CPython; 1: stable ABI of an older or equal 3.x; 2: pure Python.
  rank =
    wheel:
    let
      parts = lib.splitString "-" (lib.removeSuffix ".whl" (baseNameOf wheel.url));
      n = builtins.length parts;
      tags = i: lib.splitString "." (builtins.elemAt parts (n - i));
      pyTags = tags 3;
      abiTags = tags 2;
      abi3Ok = lib.any (
        t:
        let
          m = builtins.match "cp3([0-9]+)" t;
        in
        m != null && lib.toInt (builtins.head m) <= minor
      ) pyTags;
    in
    if !(lib.any platformOk (tags 1)) then
      null
    else if lib.elem cpTag pyTags && lib.elem cpTag abiTags then
      0
    else if lib.elem "abi3" abiTags && abi3Ok then
      1
    else if lib.elem "none" abiTags && lib.any (t: lib.elem t pyTags) [ "py3" pyVersionTag cpTag ] then
      2
    else
      null;
  wheelFor =
    p:
    let
      ranked = lib.filter (w: w.rank != null) (map (w: w // { rank = rank w; }) (p.wheels or [ ]));
      best = builtins.foldl' (a: w: if a == null || w.rank < a.rank then w else a) null ranked;
    in
    best;

  # What the Nix side fetches for a locked package: its url and the lock's hash.
  sourceOf =
    p:
    let
      wheel = wheelFor p;
    in
    if wheel != null then
      {
        inherit (wheel) url hash;
        format = "wheel";
        # A wheel with compiled code links what manylinux hosts have in /usr/lib (libstdc++,
        # libgcc_s, zlib); NixOS has no such place.
        native = wheel.rank < 2;
      }
    else if p ? sdist then
      {
        inherit (p.sdist) url hash;
        format = "pyproject";
      }
    else
      throw "uv.lock: ${keyOf p} has no wheel for ${cpTag} on ${machine} Linux and no sdist";

  # The derivations a requirement brings: its package and, for `name[extra]`, the extra's.
  requirementClosure =
    requirement:
    let
      p = resolve requirement;
      extras = lib.concatMap (e: p.optional-dependencies.${e} or [ ]) (requirement.extra or [ ]);
    in
    [ built.${keyOf p} ] ++ lib.concatMap requirementClosure (lib.filter applies extras);

  built = lib.mapAttrs (
    _: p:
    let
      source = sourceOf p;
    in
    ps.buildPythonPackage (
      {
        pname = p.name;
        inherit (p) version;
        src = fetchurl {
        inherit (source) url;
          sha256 = lib.removePrefix "sha256:" source.hash;
        };
        dependencies = lib.concatMap requirementClosure (lib.filter applies (p.dependencies or [ ]));
        # The lock's closure is what uv tested; the packages' own test inputs are not in it.
        doCheck = false;
        passthru.uvLock = {
          inherit (source) url hash;
        };
      }
      # An sdist (the lock has no wheel for it) is built by its pyproject's backend: setuptools
      # for the three such packages in the lock (odfpy, func-timeout, antlr4's runtime).
      // (
        if source.format == "wheel" then
          {
            format = "wheel";
          }
          // lib.optionalAttrs source.native {
            # Points the wheel's libraries at the store; a library still missing fails the build
            # naming it (add it here), rather than the import at run time.
            nativeBuildInputs = [ autoPatchelfHook ];
            buildInputs = [
              stdenv.cc.cc.lib
              zlib
            ];
          }
        else
          {
            pyproject = true;
            build-system = [ ps.setuptools ];
          }
      )
    )
  ) (lib.filterAttrs (_: p: p.source ? registry) packages);

  member =
    name:
    let
      candidates = lib.filter (p: !(p.source ? registry)) (byName.${name} or [ ]);
    in
    if candidates == [ ] then
      throw "uv.lock: ${name} is not a workspace member (run `uv lock`)"
    else
      builtins.head candidates;
  # Run-time requirements of a workspace member, or of one of its extras; another member is left
  # out (the caller passes the Nix package it builds from this checkout).
  closureOf =
    requirements:
    lib.concatMap requirementClosure (
      lib.filter (r: applies r && (resolve r).source ? registry) requirements
    );
in
{
  inherit built holds sourceOf;
  dependencies = name: closureOf ((member name).dependencies or [ ]);
  extra = name: extra: closureOf ((member name).optional-dependencies.${extra} or [ ]);
  extras = name: builtins.attrNames ((member name).optional-dependencies or { });
}
