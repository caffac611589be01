import pickle

from raydelay.errors import (
    CodecError,
    InvalidArgument,
    NotFound,
    RaydelayError,
    StorageError,
)


def test_the_error_tree_has_one_root_and_the_builtin_bases():
    assert issubclass(InvalidArgument, RaydelayError) and issubclass(InvalidArgument, ValueError)
    assert issubclass(NotFound, RaydelayError) and issubclass(NotFound, KeyError)
    assert issubclass(StorageError, RaydelayError)
    assert issubclass(CodecError, RaydelayError)


def test_storage_error_keeps_retriable_across_pickling():
    err = pickle.loads(pickle.dumps(StorageError("disk on fire", retriable=True)))
    assert err.retriable is True
    assert str(err) == "disk on fire"


def test_not_found_prints_plain_text():
    assert str(NotFound("no object at key 'a'")) == "no object at key 'a'"
