"""Schemas of the Pulsar-compatible client: how a producer turns a value into bytes and a
consumer turns them back. Bytes and strings are supported; the structured schemas
(JSON, Avro, Protobuf) raise ``NotImplementedError`` when used."""

from __future__ import annotations

from typing import Any


class Schema:
    """Turns values into payload bytes and back."""

    def encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BytesSchema(Schema):
    """Payloads as they are (the default)."""

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, (bytearray, memoryview)):
            obj = bytes(obj)
        if not isinstance(obj, bytes):
            raise TypeError(f"BytesSchema: expected bytes, got {type(obj).__name__}")
        return obj

    def decode(self, data: bytes) -> bytes:
        return data


class StringSchema(Schema):
    """Payloads as UTF-8 text."""

    def encode(self, obj: Any) -> bytes:
        if not isinstance(obj, str):
            raise TypeError(f"StringSchema: expected str, got {type(obj).__name__}")
        return obj.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return data.decode("utf-8")


class _Unsupported(Schema):
    feature = "structured schemas"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"raydelay.compat.pulsar: {self.feature} are not supported; "
            "send bytes (BytesSchema) or text (StringSchema)"
        )


class JsonSchema(_Unsupported):
    feature = "JSON schemas"


class AvroSchema(_Unsupported):
    feature = "Avro schemas"


class ProtobufNativeSchema(_Unsupported):
    feature = "Protobuf schemas"


class Field:
    """A field of a :class:`Record` (declaring one works; the structured schemas that
    would use it do not)."""

    def __init__(self, default: Any = None, required: bool = False, **kwargs: Any) -> None:
        self.default, self.required = default, required


class Null(Field): ...


class Boolean(Field): ...


class Integer(Field): ...


class Long(Field): ...


class Float(Field): ...


class Double(Field): ...


class Bytes(Field): ...


class String(Field): ...


class Array(Field):
    def __init__(self, array_type: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class Map(Field):
    def __init__(self, value_type: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class CustomEnum(Field):
    def __init__(self, enum_type: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class Record:
    """A structured value's declaration. Declaring one works; the JSON and Avro schemas
    that would encode it raise ``NotImplementedError``."""

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)
