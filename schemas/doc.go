// Package schemas owns Shoal's wire contracts: the {kind, turn, data} event
// envelope with its thirteen kinds (byte-compatible with Kaimon's), the NATS
// subjects, headers, stream and bucket names, agent-id and node-name rules,
// the control messages carried under shoal.>, and JSON Schema files for all
// of them.
//
// It imports only the standard library, so any program (a node, the bridge,
// a third-party observer) can depend on it without pulling in the fabric.
//
// Encoding produces Kaimon's JSON shapes exactly: a tool_use call always
// carries every key, a tool_result update carries only the fields that are
// set, and enum values outside their set are coerced to Kaimon's fallbacks.
// Decoding is strict about what must be there and lenient about extra keys,
// so newer producers do not break older readers; a malformed envelope is
// rejected with a *FieldError that names the field.
package schemas
