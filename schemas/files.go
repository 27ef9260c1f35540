package schemas

import "embed"

// JSONSchemaBase is the $id prefix of every schema file; a file's $id is
// JSONSchemaBase + its path in JSONSchemas.
const JSONSchemaBase = "https://github.com/shoalfabric/shoal/schemas/jsonschema/"

// JSONSchemas holds the JSON Schema (draft 2020-12) files of the wire
// contracts, rooted at "jsonschema/":
//
//	envelope.json        an event envelope; dispatches data on kind
//	kinds/<kind>.json    the data of each of the thirteen kinds
//	defs.json            shared definitions (content blocks, tool calls, usage, enums)
//	control/<msg>.json   each control request and reply
//
//go:embed jsonschema
var JSONSchemas embed.FS
