#ifndef KVSERVE_WORKER_CONSTRAINT_JSON_SCHEMA_H_
#define KVSERVE_WORKER_CONSTRAINT_JSON_SCHEMA_H_

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/constraint/grammar.h"

namespace kvserve::constraint {

/// A grammar for JSON documents that validate against `schema` (JSON Schema, draft 2020-12
/// keywords and their draft-7 spellings).
///
/// The grammar generates a subset of the valid documents, chosen so that a model cannot run
/// away inside it: compact whitespace (at most one space after `{ [ , :` and before `} ]`, and
/// one space or newline before the document), properties in the schema's order with every
/// required one present and no properties the schema does not name, integers of at most 16
/// digits, fractions of at most 16 and exponents of at most 2 digits. Every document it generates
/// is valid. Properties come in the order the schema text lists them (hence ordered_json).
///
/// Supported: type (and type lists), enum, const, properties, required, additionalProperties
/// (false, or anything else: extra properties are never generated), items, prefixItems,
/// minItems, maxItems, minLength, maxLength, pattern, format (date, time, date-time, uuid, ipv4,
/// email), minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf, oneOf (as anyOf), allOf
/// with one schema, $ref to "#" or into $defs / definitions, and the annotations (title,
/// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
/// Any other keyword is INVALID_ARGUMENT naming it and where it is ("multipleOf at
/// /properties/x is not supported").
absl::StatusOr<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema);

/// Adds the rules for JSON documents valid against `schema` (as JsonSchemaGrammar, without the
/// optional whitespace before the document) to `builder` and returns the symbol that matches
/// one, so that other grammars (tool calls) can embed a schema. Errors as JsonSchemaGrammar.
/// `schema` must outlive the call only.
absl::StatusOr<Symbol> AddJsonSchemaRule(GrammarBuilder* builder,
                                         const nlohmann::ordered_json& schema);

/// A grammar for any JSON object (the OpenAI API's response_format "json_object").
absl::StatusOr<Grammar> JsonObjectGrammar();

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_JSON_SCHEMA_H_
