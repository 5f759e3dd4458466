"""
Tests for configurator.py: config files and --key=value flags over a script's globals.

    python -m pytest -q tests/test_configurator.py
"""
import json
import os

import pytest

from configurator import configure, print_config, save_config


def script_globals():
    """What a train.py module namespace looks like when it calls configure()."""
    return dict(
        __name__='__main__', _private_helper=3, os=os, helper=lambda x: x,  # never config keys
        learning_rate=2e-5, batch_size=32, compile=False, out_dir='out', init_from=None,
        betas=(0.9, 0.999), eval_datasets=['A', 'B'], extra={'a': 1},
    )


def write(tmp_path, text, name='override.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_keys_are_public_plain_values_and_globals_update_in_place():
    namespace = script_globals()
    config = configure(namespace, ['--batch_size=8'])
    assert list(config) == ['learning_rate', 'batch_size', 'compile', 'out_dir', 'init_from',
                            'betas', 'eval_datasets', 'extra']
    assert namespace['batch_size'] == 8 and config['batch_size'] == 8


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = write(tmp_path, 'learning_rat = 1e-5\n')
    with pytest.raises(ValueError, match=r"override\.py.*'learning_rat'.*learning_rate"):
        configure(script_globals(), [path])


def test_file_may_import_and_use_private_names(tmp_path):
    path = write(tmp_path, 'import math\n_base = 4\nbatch_size = int(math.sqrt(_base)) * 16\n')
    assert configure(script_globals(), [path])['batch_size'] == 32


def test_unknown_key_on_command_line_suggests_close_match():
    with pytest.raises(ValueError, match=r"'learning_rat'.*did you mean learning_rate"):
        configure(script_globals(), ['--learning_rat=1e-5'])


def test_flag_without_value_is_an_error():
    with pytest.raises(ValueError, match='--key=value'):
        configure(script_globals(), ['--compile'])


def test_wrong_type_names_key_and_types():
    with pytest.raises(TypeError, match=r"batch_size expects int.*got str"):
        configure(script_globals(), ["--batch_size='8'"])
    with pytest.raises(ValueError, match='not a Python literal'):
        configure(script_globals(), ['--batch_size=eight'])


def test_wrong_type_in_file_names_the_file(tmp_path):
    path = write(tmp_path, 'compile = "yes"\n')
    with pytest.raises(TypeError, match=r"override\.py.*compile expects bool.*got str"):
        configure(script_globals(), [path])


def test_int_accepted_for_float_and_converted():
    config = configure(script_globals(), ['--learning_rate=1'])
    assert config['learning_rate'] == 1.0 and type(config['learning_rate']) is float


def test_bool_rejected_for_int_and_float_and_int_for_bool():
    for flag in ['--batch_size=True', '--learning_rate=False', '--compile=1']:
        with pytest.raises(TypeError):
            configure(script_globals(), [flag])


def test_only_first_equals_splits():
    assert configure(script_globals(), ['--out_dir=a=b'])['out_dir'] == 'a=b'


def test_string_without_quotes_and_numeric_looking_string():
    config = configure(script_globals(), ['--out_dir=out/run1'])
    assert config['out_dir'] == 'out/run1'
    assert configure(script_globals(), ['--out_dir=2024'])['out_dir'] == '2024'
    assert configure(script_globals(), ["--out_dir='quoted'"])['out_dir'] == 'quoted'


def test_none_default_accepts_literal_or_raw_text():
    assert configure(script_globals(), ['--init_from=3'])['init_from'] == 3
    assert configure(script_globals(), ['--init_from=out/stage1/step2000'])['init_from'] == 'out/stage1/step2000'


def test_list_and_tuple_values_keep_the_default_type():
    config = configure(script_globals(), ["--eval_datasets=['C', 'D', 'E']", '--betas=[0.8,0.9]'])
    assert config['eval_datasets'] == ['C', 'D', 'E']
    assert config['betas'] == (0.8, 0.9)
    with pytest.raises(TypeError):
        configure(script_globals(), ['--eval_datasets=7'])


def test_arguments_apply_left_to_right(tmp_path):
    path = write(tmp_path, 'batch_size = 16\nlearning_rate = 2e-6\n')
    config = configure(script_globals(), [path, '--batch_size=4'])
    assert config['batch_size'] == 4 and config['learning_rate'] == 2e-6
    config = configure(script_globals(), ['--batch_size=4', path])
    assert config['batch_size'] == 16


def test_config_round_trips_through_json(tmp_path, capsys):
    config = configure(script_globals(), ['--betas=(0.5, 0.6)', '--out_dir=out/run1'])
    path = str(tmp_path / 'config.json')
    save_config(config, path)
    loaded = json.load(open(path))
    assert loaded == {**config, 'betas': [0.5, 0.6]}  # JSON has no tuples
    assert configure(script_globals(), [f'--{key}={value!r}' for key, value in loaded.items()]) == config
    print_config(config)
    assert "out_dir       = 'out/run1'" in capsys.readouterr().out
