// The corpus of JSON schemas the grammar engine is checked on (tests/grammar/json_schema_test.cpp
// walks their masks with random vocabularies; tests/engine/structured_output_test.cpp has the
// default model answer under each): every kind of keyword the compiler supports.
#pragma once

#include <string>
#include <vector>

namespace inferd::test {

inline const std::vector<std::string>& schema_corpus() {
  static const std::vector<std::string> c = {
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]})",
      R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}, "c": {"type": "boolean"}}})",
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true})",
      R"({"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "string", "maxLength": 3}})",
      R"({"type": "object"})",
      R"({"type": "array", "items": {"type": "integer"}})",
      R"({"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4})",
      R"({"type": "array", "items": {"type": "boolean"}, "maxItems": 1})",
      R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
      R"({"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "null"}, "minItems": 2})",
      R"({"enum": ["red", "green", "blue", 42, null, {"k": [1]}]})",
      R"({"const": {"fixed": "yes", "n": [1, 2]}})",
      R"({"type": "string", "minLength": 2, "maxLength": 5})",
      R"({"type": "string", "minLength": 3})",
      R"({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3,4}$"})",
      R"({"type": "string", "pattern": "^(foo|bar)+\\.txt$"})",
      R"({"type": "string", "pattern": "^a\"b\\\\c$"})",
      R"({"type": "string", "format": "date"})",
      R"({"type": "string", "format": "date-time"})",
      R"({"type": "string", "format": "time"})",
      R"({"type": "string", "format": "uuid"})",
      R"({"type": "string", "format": "email"})",
      R"({"type": "integer", "minimum": 0, "maximum": 100})",
      R"({"type": "integer", "minimum": -50, "maximum": 7})",
      R"({"type": "integer", "exclusiveMinimum": 10})",
      R"({"type": "integer", "maximum": -3})",
      R"({"type": "integer", "minimum": 1234, "maximum": 98765})",
      R"({"type": "number", "minimum": 0, "maximum": 1})",
      R"({"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 3})",
      R"({"type": "number"})",
      R"({"anyOf": [{"type": "string"}, {"type": "integer"}]})",
      R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]}, {"type": "array", "items": {"type": "integer"}}]})",
      R"({"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}]})",
      R"({"type": ["string", "null"]})",
      R"({"type": "integer", "nullable": true})",
      R"({})",
      R"({"type": "boolean"})",
      R"({"type": "null"})",
      R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}},
          "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"]})",
      R"({"definitions": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}}, "required": ["value"]}},
          "$ref": "#/definitions/node"})",
      R"({"type": "object", "properties": {"user": {"type": "object", "properties": {"name": {"type": "string"}, "emails": {"type": "array", "items": {"type": "string", "format": "email"}}, "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]}}, "required": ["name", "address"]}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}, "score": {"type": "number", "minimum": 0}}, "required": ["user"]})",
      R"({"title": "annotated", "description": "ignored", "type": "object", "properties": {"q": {"type": "string", "description": "x", "default": "d", "examples": ["e"]}}, "required": ["q"]})",
      R"({"type": "object", "properties": {"é-ключ": {"type": "string", "maxLength": 2}, "with \"quote\"": {"type": "integer"}}, "required": ["é-ключ", "with \"quote\""]})",
  };
  return c;
}

}  // namespace inferd::test
