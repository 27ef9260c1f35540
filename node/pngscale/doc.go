// Package pngscale owns the downsampling of PNG images carried in agent tool
// results, so that large screenshots do not consume a model's context: an
// image costs roughly width×height/750 tokens, and a model caps the long
// edge of what it looks at anyway (DefaultMaxLongEdge).
//
// The reduction is a deliberately simple, reproducible integer box filter:
// with long = max(width, height) and a limit L, an image whose long edge
// exceeds L is reduced by the integer factor f = ceil(long/L) to
// ceil(width/f)×ceil(height/f), each output pixel being the mean of the f×f
// source box at (x·f, y·f), clipped at the right and bottom edges. R, G, B
// and A are averaged independently as straight (non-premultiplied) values,
// and each mean is rounded to the nearest 8-bit value (halves up, computed
// exactly in integers rather than floating point). The result is always
// an 8-bit NRGBA image, which image/png stores as 8-bit RGBA, or as 8-bit
// RGB when every output pixel is opaque (same pixel values either way).
//
// Anything that is not worth or not safe to touch is returned unchanged, the
// very same slice or string: a disabled limit, an image already within the
// limit, input that does not decode as a PNG, an image of more than 2^26
// pixels (8192×8192; refused before decoding, as a decompression-bomb guard),
// and a failed encode. The functions never panic.
package pngscale
