# Merges the module's boot.kernel.sysctl definitions with NixOS's own ones the way NixOS does,
# with builtins only (no nixpkgs, so it runs in CI): NixOS types each sysctl as a single value
# (bool, int, string or null) merged like lib's mergeOneOption after filterOverrides: only the
# definitions of the highest priority (lowest number) count, and more than one of them is an
# error even when they are equal. The module is called as the module system would call it, with
# mkOverride/mkIf/mkMerge building the same tagged records as nixpkgs' lib.
#   nix-instantiate --eval --json sysctl_eval.nix --arg module ./drumsd.nix \
#     --arg nixosDefinitions ./fixtures/nixos-sysctl-definitions.nix --argstr hostJson '{...}'
# hostJson: the host's own boot.kernel.sysctl (plain definitions, priority 100). A conflict throws
# NixOS's message.
{
  module,
  nixosDefinitions,
  hostJson ? "{}",
}:
let
  mkOverride = priority: content: {
    _type = "override";
    inherit priority content;
  };
  lib = {
    inherit mkOverride;
    mkDefault = mkOverride 1000;
    mkForce = mkOverride 50;
    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    mkMerge = contents: {
      _type = "merge";
      inherit contents;
    };
  };

  # mkIf and mkMerge pushed down, as the module system does before merging.
  discharge =
    v:
    if !builtins.isAttrs v then
      [ v ]
    else if v._type or "" == "if" then
      (if v.condition then discharge v.content else [ ])
    else if v._type or "" == "merge" then
      builtins.concatMap discharge v.contents
    else
      [ v ];
  at =
    path: v:
    builtins.concatMap (
      d:
      if path == [ ] then
        [ d ]
      else if builtins.isAttrs d && d ? ${builtins.head path} then
        at (builtins.tail path) d.${builtins.head path}
      else
        [ ]
    ) (discharge v);

  enabled = {
    services.drumsd = {
      enable = true;
    };
  };
  evaluated = (import module) {
    config = enabled;
    inherit lib;
    pkgs = { };
  };
  moduleFile = toString module;

  # One definition: { file; priority; value; } from a possibly mkOverride'd value.
  definition =
    file: raw:
    builtins.map (
      v:
      if builtins.isAttrs v && v._type or "" == "override" then
        {
          inherit file;
          inherit (v) priority;
          value = v.content;
        }
      else
        {
          inherit file;
          priority = 100;
          value = v;
        }
    ) (discharge raw);

  fromAttrs =
    file: sets:
    builtins.concatMap (
      set:
      builtins.concatMap (
        name: map (d: d // { inherit name; }) (definition file set.${name})
      ) (builtins.attrNames set)
    ) sets;

  definitions =
    import nixosDefinitions
    ++ fromAttrs moduleFile (
      at [
        "boot"
        "kernel"
        "sysctl"
      ] (evaluated.config or { })
    )
    ++ fromAttrs "the host's configuration" [ (builtins.fromJSON hostJson) ];

  names = builtins.attrNames (builtins.listToAttrs (map (d: {
    inherit (d) name;
    value = null;
  }) definitions));

  sysctlValue = v: v == null || builtins.isBool v || builtins.isInt v || builtins.isString v;

  merge =
    name:
    let
      defs = builtins.filter (d: d.name == name) definitions;
      best = builtins.foldl' (p: d: if d.priority < p then d.priority else p) 1500 defs;
      winners = builtins.filter (d: d.priority == best) defs;
      listing = builtins.concatStringsSep "\n" (
        map (d: "       - In `${d.file}': ${builtins.toJSON d.value}") winners
      );
      bad = builtins.filter (d: !sysctlValue d.value) winners;
    in
    if bad != [ ] then
      throw "A definition for option `boot.kernel.sysctl.\"${name}\"' is not of type `sysctl option value'. In `${(builtins.head bad).file}': ${builtins.toJSON (builtins.head bad).value}"
    else if builtins.length winners > 1 then
      throw "The option `boot.kernel.sysctl.\"${name}\"' is defined multiple times while it's expected to be unique.\n\n       Definition values:\n${listing}"
    else
      {
        inherit (builtins.head winners) value file priority;
      };
in
builtins.listToAttrs (
  map (name: {
    inherit name;
    value = merge name;
  }) names
)
