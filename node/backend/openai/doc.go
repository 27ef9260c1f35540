// Package openai speaks to OpenAI-compatible model servers, among them
// mlx_lm.server on Apple machines (vmlx:<tag>). A node uses it to learn
// which models a server offers, so placement sends vmlx:<tag> to the
// machine that serves it.
package openai
