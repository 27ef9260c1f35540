package bridge

import "encoding/binary"

// DefaultJuliaVersion is the Serialization version byte written in the
// header. Julia's reader accepts any version up to its own; 0x1D (29) is
// the one Julia 1.12 writes, and every later reader accepts it.
const DefaultJuliaVersion = 0x1D

// juliaPrefix is the Julia Serialization stream up to the first field of
// a NamedTuple{(:channel, :data, :session_name), Tuple{String,String,String}}:
// the 8-byte header, then OBJECT, the NamedTuple DataType (name, module
// Core, two parameters: the field-name tuple and the field-type tuple).
var juliaPrefix = []byte{
	0x37, 0x4A, 0x4C, DefaultJuliaVersion, 0x04, 0x00, 0x00, 0x00, // "7JL", version, little-endian 64-bit
	0x34,                                                         // OBJECT
	0x10,                                                         // DATATYPE
	0x01, 0x0A, 'N', 'a', 'm', 'e', 'd', 'T', 'u', 'p', 'l', 'e', // :NamedTuple
	0x1F, 0x4E, 0x9B, 0x44, // module Core
	0x02, 0x00, 0x00, 0x00, // two type parameters
	0x14, 0x03, // a tuple of three symbols
	0x01, 0x07, 'c', 'h', 'a', 'n', 'n', 'e', 'l',
	0x01, 0x04, 'd', 'a', 't', 'a',
	0x01, 0x0C, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'n', 'a', 'm', 'e',
	0x10, 0x53, // DATATYPE :Tuple
	0x1F, 0x4E, 0x9B, 0x44, // module Core
	0x03, 0x00, 0x00, 0x00, // three type parameters
	0x00, 0x21, 0x00, 0x21, 0x00, 0x21, // String, String, String
}

// JuliaNamedTuple encodes (channel, data, session_name) as Julia's
// Serialization writes the NamedTuple, which is the payload of every
// Kaimon bus message. version is the header's version byte.
func JuliaNamedTuple(channel, data, sessionName string, version byte) []byte {
	b := make([]byte, 0, len(juliaPrefix)+len(channel)+len(data)+len(sessionName)+30)
	b = append(b, juliaPrefix...)
	b[3] = version
	for _, s := range []string{channel, data, sessionName} {
		b = appendJuliaString(b, s)
	}
	return b
}

// appendJuliaString writes a String field: up to 7 bytes as a short
// STRING; 8 to 255 bytes as SHARED_REF then a short STRING; longer as
// SHARED_REF then a LONGSTRING with an Int64 length. Lengths are bytes.
func appendJuliaString(b []byte, s string) []byte {
	switch n := len(s); {
	case n <= 7:
		b = append(b, 0x21, byte(n))
	case n <= 255:
		b = append(b, 0x39, 0x21, byte(n))
	default:
		b = append(b, 0x39, 0x30)
		b = binary.LittleEndian.AppendUint64(b, uint64(n))
	}
	return append(b, s...)
}
