package pngscale

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
)

// DefaultMaxLongEdge is the long-edge limit, in pixels, past which a model
// downsamples an image by itself; shrinking to it loses nothing the model
// would have seen.
const DefaultMaxLongEdge = 1568

// maxPixels bounds the pixel count of an image Shrink is willing to decode.
// A PNG header can claim a huge size in a few bytes and the decoder
// allocates the whole image up front, so larger images are treated like
// undecodable ones and returned unchanged. 1<<26 pixels is 8192×8192.
const maxPixels = 1 << 26

// Shrink returns data, a PNG image, reduced so that its long edge is at most
// maxLongEdge pixels, re-encoded as an 8-bit NRGBA PNG (see the package
// documentation for the exact filter). It returns data itself, unchanged,
// when maxLongEdge <= 0, when the image's long edge is already within the
// limit, when data does not decode as a PNG, or when encoding fails.
func Shrink(data []byte, maxLongEdge int) []byte {
	out, ok := shrink(data, maxLongEdge)
	if !ok {
		return data
	}
	return out
}

// ShrinkBase64 is Shrink on standard-encoding base64 text, the form image
// blocks take in tool results. It returns b64 itself when Shrink would leave
// the image unchanged or when b64 is not valid base64.
func ShrinkBase64(b64 string, maxLongEdge int) string {
	if maxLongEdge <= 0 {
		return b64
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return b64
	}
	out, ok := shrink(data, maxLongEdge)
	if !ok {
		return b64
	}
	return base64.StdEncoding.EncodeToString(out)
}

// shrink does the work of Shrink and reports whether it produced a new
// image; false means the input is to be returned unchanged.
func shrink(data []byte, maxLongEdge int) (out []byte, ok bool) {
	if maxLongEdge <= 0 {
		return nil, false
	}
	// The standard decoder should not panic, but a panic must never escape
	// into the caller's tool-result path.
	defer func() {
		if recover() != nil {
			out, ok = nil, false
		}
	}()
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, false
	}
	if int64(cfg.Width)*int64(cfg.Height) > maxPixels {
		return nil, false
	}
	if max(cfg.Width, cfg.Height) <= maxLongEdge {
		return nil, false
	}
	src, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, false
	}
	b := src.Bounds()
	long := max(b.Dx(), b.Dy())
	if long <= maxLongEdge {
		return nil, false
	}
	f := (long + maxLongEdge - 1) / maxLongEdge
	dst := boxReduce(src, f)
	var buf bytes.Buffer
	if err := png.Encode(&buf, dst); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// boxReduce reduces src by the integer factor f (f >= 1): each output pixel
// is the mean of the f×f source box it covers, clipped at the right and
// bottom edges, computed per straight-alpha 8-bit channel and rounded to
// nearest (halves up).
//
// The mean of the box in [0,1] is Σv/(255·n), so round(mean·255) is
// round(Σv/n); it is computed exactly in integers, which makes the result
// independent of summation order and free of floating-point error.
func boxReduce(src image.Image, f int) *image.NRGBA {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	ow, oh := (w+f-1)/f, (h+f-1)/f
	dst := image.NewNRGBA(image.Rect(0, 0, ow, oh))
	if ow == 0 || oh == 0 {
		return dst
	}

	read := rowReader(src)
	row := make([]uint8, 4*w)
	sums := make([]uint64, 4*ow)
	for oy := 0; oy < oh; oy++ {
		y0 := oy * f
		y1 := min(y0+f, h)
		clear(sums)
		for y := y0; y < y1; y++ {
			px := read(row, y)
			for ox := 0; ox < ow; ox++ {
				x0 := ox * f
				x1 := min(x0+f, w)
				var r, g, bl, a uint64
				seg := px[4*x0 : 4*x1]
				for i := 0; i+3 < len(seg); i += 4 {
					r += uint64(seg[i])
					g += uint64(seg[i+1])
					bl += uint64(seg[i+2])
					a += uint64(seg[i+3])
				}
				s := sums[4*ox : 4*ox+4 : 4*ox+4]
				s[0] += r
				s[1] += g
				s[2] += bl
				s[3] += a
			}
		}
		bh := uint64(y1 - y0)
		out := dst.Pix[oy*dst.Stride : oy*dst.Stride+4*ow]
		for ox := 0; ox < ow; ox++ {
			x0 := ox * f
			n := uint64(min(x0+f, w)-x0) * bh
			for c := 0; c < 4; c++ {
				out[4*ox+c] = uint8((2*sums[4*ox+c] + n) / (2 * n))
			}
		}
	}
	return dst
}

// rowReader returns a function that yields source row y (0-based within the
// bounds) as straight-alpha 8-bit RGBA bytes, exactly as color.NRGBAModel
// would convert each pixel. The returned slice is either buf (len 4·width)
// filled in, or a view of the source's own pixels; it must not be written.
func rowReader(src image.Image) func(buf []uint8, y int) []uint8 {
	b := src.Bounds()
	w := b.Dx()
	switch m := src.(type) {
	case *image.NRGBA:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			return m.Pix[i : i+4*w]
		}
	case *image.RGBA:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+4*w]
			for x := 0; x < 4*w; x += 4 {
				r, g, bl, a := uint32(s[x]), uint32(s[x+1]), uint32(s[x+2]), uint32(s[x+3])
				putNRGBA(buf[x:x+4], r*0x101, g*0x101, bl*0x101, a*0x101)
			}
			return buf
		}
	case *image.RGBA64:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+8*w]
			for x := 0; x < w; x++ {
				p := s[8*x : 8*x+8]
				putNRGBA(buf[4*x:4*x+4], be16(p[0:]), be16(p[2:]), be16(p[4:]), be16(p[6:]))
			}
			return buf
		}
	case *image.NRGBA64:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+8*w]
			for x := 0; x < w; x++ {
				p := s[8*x : 8*x+8]
				a := be16(p[6:])
				// As color.NRGBA64.RGBA premultiplies before the model
				// converts back.
				putNRGBA(buf[4*x:4*x+4], be16(p[0:])*a/0xffff, be16(p[2:])*a/0xffff, be16(p[4:])*a/0xffff, a)
			}
			return buf
		}
	case *image.Gray:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+w]
			for x, v := range s {
				buf[4*x], buf[4*x+1], buf[4*x+2], buf[4*x+3] = v, v, v, 0xff
			}
			return buf
		}
	case *image.Gray16:
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+2*w]
			for x := 0; x < w; x++ {
				v := s[2*x] // the high byte: (y<<8|lo)>>8
				buf[4*x], buf[4*x+1], buf[4*x+2], buf[4*x+3] = v, v, v, 0xff
			}
			return buf
		}
	case *image.Paletted:
		var table [256][4]uint8 // indices past the palette read as zero
		for i, c := range m.Palette {
			if i >= len(table) {
				break
			}
			if c == nil {
				continue
			}
			n := color.NRGBAModel.Convert(c).(color.NRGBA)
			table[i] = [4]uint8{n.R, n.G, n.B, n.A}
		}
		return func(buf []uint8, y int) []uint8 {
			i := m.PixOffset(b.Min.X, b.Min.Y+y)
			s := m.Pix[i : i+w]
			for x, idx := range s {
				copy(buf[4*x:4*x+4], table[idx][:])
			}
			return buf
		}
	}
	return func(buf []uint8, y int) []uint8 {
		return readRowGeneric(src, buf, y)
	}
}

// readRowGeneric is the reference conversion: At and color.NRGBAModel.
func readRowGeneric(src image.Image, buf []uint8, y int) []uint8 {
	b := src.Bounds()
	for x := 0; x < b.Dx(); x++ {
		c := color.NRGBAModel.Convert(src.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
		buf[4*x], buf[4*x+1], buf[4*x+2], buf[4*x+3] = c.R, c.G, c.B, c.A
	}
	return buf[:4*b.Dx()]
}

// putNRGBA stores the 16-bit premultiplied colour (r, g, b, a) into p as
// straight 8-bit RGBA, by the same arithmetic as color.NRGBAModel.
func putNRGBA(p []uint8, r, g, b, a uint32) {
	switch a {
	case 0xffff:
		p[0], p[1], p[2], p[3] = uint8(r>>8), uint8(g>>8), uint8(b>>8), 0xff
	case 0:
		p[0], p[1], p[2], p[3] = 0, 0, 0, 0
	default:
		r = (r * 0xffff) / a
		g = (g * 0xffff) / a
		b = (b * 0xffff) / a
		p[0], p[1], p[2], p[3] = uint8(r>>8), uint8(g>>8), uint8(b>>8), uint8(a>>8)
	}
}

func be16(p []uint8) uint32 { return uint32(p[0])<<8 | uint32(p[1]) }
