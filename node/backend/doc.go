// Package backend defines the interface every agent backend implements
// (the claude CLI, ACP agents, Ollama and OpenAI-compatible servers), one
// package per kind beneath it. Backends import this package and schemas,
// never each other.
package backend
