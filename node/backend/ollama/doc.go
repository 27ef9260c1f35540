// Package ollama speaks to Ollama servers (/api/chat, /api/tags). A node
// uses it to learn which model tags a server offers, so placement can send
// ollama:<tag> where that tag is.
package ollama
