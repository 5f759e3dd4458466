"""
Config for train.py and eval.py: module-level globals, overridden by config files, then by --key=value.

A script defines its defaults as plain globals, one comment each, then resolves them:

    learning_rate = 2e-5  # AdamW peak learning rate (Table 3)
    ...
    config = configure(globals(), sys.argv[1:])  # updates the globals in place, returns the dict

and is run as

    python train.py config/stage1.py --learning_rate=1e-5 --out_dir=out/run1

Arguments apply left to right, so later ones win. Which globals are config keys: every name that does
not start with '_' and whose value is None or an int, float, bool, str, list, tuple or dict, at the
moment configure() is called. Modules, functions and classes are never keys; give a plain-valued
helper a leading '_' if it must sit above the call. Unlike nanoGPT's configurator, a file or flag that
names an unknown key fails, and `--learning_rate=1` is accepted for a float default.
"""
import ast
import difflib
import json
import os
import types

CONFIG_TYPES = (type(None), bool, int, float, str, list, tuple, dict)


def config_keys(namespace):
    """The config part of a namespace, in definition order: public names holding plain values."""
    return {key: value for key, value in namespace.items()
            if not key.startswith('_') and isinstance(value, CONFIG_TYPES)}


def unknown_key_message(key, keys, source):
    close = difflib.get_close_matches(key, keys, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{source}: unknown config key {key!r}{hint}"


def checked(key, value, default, source):
    """value, converted to the default's type where that is lossless; TypeError on a mismatch."""
    if default is None:  # no type to check against
        return value
    if isinstance(default, bool) or isinstance(value, bool):  # bool is an int subclass: never mix them
        ok = isinstance(default, bool) and isinstance(value, bool)
    elif isinstance(default, float) and isinstance(value, int):  # `--learning_rate=1` means 1.0
        return float(value)
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)  # `(1, 2)` and `[1, 2]` both mean a sequence
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise TypeError(f"{source}: {key} expects {type(default).__name__} (default {default!r}), "
                        f"got {type(value).__name__} {value!r}")
    return value


def parse_flag(arg, config):
    """'--key=value' -> (key, value). A str key keeps the raw text unless it parses to a str literal."""
    if '=' not in arg:
        raise ValueError(f"{arg}: expected --key=value")
    key, text = arg[2:].split('=', 1)  # only the first '=' splits: --out_dir=a=b gives 'a=b'
    if key not in config:
        raise ValueError(unknown_key_message(key, config, arg))
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if not isinstance(config[key], (str, type(None))):
            raise ValueError(f"{arg}: {text!r} is not a Python literal") from None
        return key, text  # --out_dir=out/run1
    if isinstance(config[key], str) and not isinstance(value, str):
        return key, text  # --run_name=2024 is the string '2024'
    return key, value


def read_config_file(path, config):
    """The names a config file assigns. It runs in a fresh namespace: it may import and compute."""
    with open(path) as f:
        namespace = {'__file__': path}
        exec(compile(f.read(), path, 'exec'), namespace)
    overrides = {key: value for key, value in namespace.items()
                 if not key.startswith('_') and not callable(value) and not isinstance(value, types.ModuleType)}
    for key in overrides:
        if key not in config:
            raise ValueError(unknown_key_message(key, config, path))
    return overrides


def configure(namespace, args):
    """Apply config files and --key=value flags (in order) to namespace; return the config dict."""
    config = config_keys(namespace)
    for arg in args:
        if arg.startswith('--'):
            key, value = parse_flag(arg, config)
            config[key] = checked(key, value, config[key], arg)
        else:
            for key, value in read_config_file(arg, config).items():
                config[key] = checked(key, value, config[key], arg)
    namespace.update(config)
    return config


def print_config(config):
    width = max(map(len, config), default=0)
    for key, value in config.items():
        print(f"{key:<{width}} = {value!r}")


def save_config(config, path):
    """Write config as JSON (tuples become lists), atomically: a crash never leaves half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, 'w') as f:
        json.dump(config, f, indent=2)
        f.write('\n')
    os.replace(tmp, path)
