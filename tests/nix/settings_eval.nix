# Evaluates the generated settings options without nixpkgs: a stub `lib` records each option's
# type, bounds check and default, so tests/nix can compare them with drumsd's config model.
# Usage: nix-instantiate --eval --strict --json settings_eval.nix
#          --arg optionsFile ./drumsd-settings.nix --argstr probesJson '[...]'
{
  optionsFile,
  probesJson ? "[]",
}:
let
  tag =
    name: extra:
    {
      kind = name;
    }
    // extra;
  types = {
    str = tag "str" { check = builtins.isString; };
    bool = tag "bool" { check = builtins.isBool; };
    int = tag "int" { check = builtins.isInt; };
    number = tag "number" { check = x: builtins.isInt x || builtins.isFloat x; };
    enum =
      values:
      tag "enum" {
        inherit values;
        check = x: builtins.elem x values;
      };
    nullOr =
      t:
      tag "nullOr" {
        elem = t;
        check = x: x == null || t.check x;
      };
    listOf =
      t:
      tag "listOf" {
        elem = t;
        check = x: builtins.isList x && builtins.all t.check x;
      };
    attrsOf =
      t:
      tag "attrsOf" {
        elem = t;
        check = x: builtins.isAttrs x && builtins.all t.check (builtins.attrValues x);
      };
    addCheck = t: extra: t // { check = x: t.check x && extra x; };
    submodule =
      m:
      tag "submodule" {
        inherit (m) options;
        freeform = m ? freeformType;
        check = builtins.isAttrs;
      };
  };
  lib = {
    inherit types;
    mkOption = o: o;
  };
  jsonFormat.type = tag "json" { check = _: true; };
  options = import optionsFile { inherit lib jsonFormat; };

  describe =
    t:
    if t.kind == "nullOr" || t.kind == "listOf" || t.kind == "attrsOf" then
      "${t.kind} ${describe t.elem}"
    else if t.kind == "enum" then
      "enum ${builtins.toJSON t.values}"
    else
      t.kind;

  summarize = builtins.mapAttrs (
    name: o:
    if o.type.kind == "submodule" then
      {
        block = true;
        freeform = o.type.freeform;
        options = summarize o.type.options;
      }
    else
      {
        block = false;
        type = describe o.type;
        hasDefault = o ? default;
      }
      // (
        if o ? default then
          {
            inherit (o) default;
            defaultType = builtins.typeOf o.default;
            defaultPasses = o.type.check o.default;
          }
        else
          { }
      )
  );

  optionAt =
    opts: path:
    let
      head = builtins.head path;
      rest = builtins.tail path;
      o = opts.${head};
    in
    if rest == [ ] then o else optionAt o.type.options rest;

  probe = p: {
    inherit (p) path value;
    accepted = (optionAt options p.path).type.check p.value;
  };
in
{
  tree = summarize options;
  probes = map probe (builtins.fromJSON probesJson);
}
