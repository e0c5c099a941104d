# The few nixpkgs lib functions drums' flake, overlay and packages use, written from their
# documented behaviour (not nixpkgs' code).
rec {
  genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names);
  optional = cond: x: if cond then [ x ] else [ ];
  optionals = cond: xs: if cond then xs else [ ];
  assertMsg = cond: msg: if cond then true else throw msg;
  escapeShellArg = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] (toString s) + "'";
  concatMapStrings = f: xs: builtins.concatStringsSep "" (map f xs);
  licenses.asl20 = {
    spdxId = "Apache-2.0";
  };
  platforms.linux = [
    "x86_64-linux"
    "aarch64-linux"
  ];
  fileset = {
    # Every file named must exist: that is what the real toSource would insist on too.
    unions = paths: paths;
    toSource =
      { root, fileset }:
      assert builtins.all builtins.pathExists fileset;
      assert builtins.all (p: builtins.substring 0 (builtins.stringLength (toString root)) (toString p) == toString root) fileset;
      root;
  };
}
