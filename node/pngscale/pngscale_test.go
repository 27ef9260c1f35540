package pngscale

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"testing"
)

func encode(tb testing.TB, img image.Image) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		tb.Fatalf("encode: %v", err)
	}
	return buf.Bytes()
}

func decode(tb testing.TB, data []byte) image.Image {
	tb.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		tb.Fatalf("decode: %v", err)
	}
	return img
}

// asNRGBA returns the straight-alpha 8-bit pixels of a decoded output. The
// encoder stores an opaque NRGBA image as 8-bit RGB, which decodes as
// *image.RGBA with the same values.
func asNRGBA(tb testing.TB, img image.Image) *image.NRGBA {
	tb.Helper()
	switch m := img.(type) {
	case *image.NRGBA:
		return m
	case *image.RGBA:
		return &image.NRGBA{Pix: m.Pix, Stride: m.Stride, Rect: m.Rect} // opaque: identical bytes
	}
	tb.Fatalf("output decodes as %T, want 8-bit RGB(A)", img)
	return nil
}

// sameSlice reports whether a and b are the very same slice.
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && cap(a) == cap(b) && (len(a) == 0 || &a[0] == &b[0])
}

// gradient is a cheap, compressible w×h test image.
func gradient(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			i := img.PixOffset(x, y)
			img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = uint8(x), uint8(y), uint8(x^y), 0xff
		}
	}
	return img
}

// reference is a deliberately naive implementation of the documented
// filter, through At and color.NRGBAModel only.
func reference(src image.Image, f int) *image.NRGBA {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	ow, oh := (w+f-1)/f, (h+f-1)/f
	dst := image.NewNRGBA(image.Rect(0, 0, ow, oh))
	for oy := 0; oy < oh; oy++ {
		for ox := 0; ox < ow; ox++ {
			var s [4]uint64
			var n uint64
			for y := oy * f; y < min(oy*f+f, h); y++ {
				for x := ox * f; x < min(ox*f+f, w); x++ {
					c := color.NRGBAModel.Convert(src.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
					s[0] += uint64(c.R)
					s[1] += uint64(c.G)
					s[2] += uint64(c.B)
					s[3] += uint64(c.A)
					n++
				}
			}
			var px [4]uint8
			for c := range px {
				// round(s/n), halves up.
				q, r := s[c]/n, s[c]%n
				if 2*r >= n {
					q++
				}
				px[c] = uint8(q)
			}
			dst.SetNRGBA(ox, oy, color.NRGBA{px[0], px[1], px[2], px[3]})
		}
	}
	return dst
}

func TestTallImage(t *testing.T) {
	in := encode(t, gradient(80, 2000))
	out := Shrink(in, 1568)
	got := decode(t, out)
	if b := got.Bounds(); b.Dx() != 40 || b.Dy() != 1000 {
		t.Fatalf("size = %v, want 40×1000", b.Size())
	}
	asNRGBA(t, got)
}

func TestSquare3000(t *testing.T) {
	// Gray keeps this big case cheap to encode and decode under -race.
	src := image.NewGray(image.Rect(0, 0, 3000, 3000))
	for y := 0; y < 3000; y++ {
		row := src.Pix[y*src.Stride : y*src.Stride+3000]
		for x := range row {
			row[x] = uint8(x*7 + y*3)
		}
	}
	out := Shrink(encode(t, src), DefaultMaxLongEdge)
	got := asNRGBA(t, decode(t, out))
	if b := got.Bounds(); b.Dx() != 1500 || b.Dy() != 1500 {
		t.Fatalf("size = %v, want 1500×1500", b.Size())
	}
	// Spot-check against the gradient: box (2x..2x+1, 2y..2y+1).
	for _, p := range [][2]int{{0, 0}, {1, 0}, {63, 17}, {700, 1499}, {1499, 1499}} {
		x, y := p[0], p[1]
		s := 0
		for dy := 0; dy < 2; dy++ {
			for dx := 0; dx < 2; dx++ {
				s += int(src.GrayAt(2*x+dx, 2*y+dy).Y)
			}
		}
		v := uint8((s + 2) / 4)
		want := color.NRGBA{v, v, v, 255}
		if c := got.NRGBAAt(x, y); c != want {
			t.Errorf("(%d,%d) = %v, want %v", x, y, c, want)
		}
	}
}

func TestSmallPassesThrough(t *testing.T) {
	for _, size := range [][2]int{{1568, 1568}, {1568, 10}, {10, 1568}, {1, 1}, {300, 200}} {
		in := encode(t, gradient(size[0], size[1]))
		if out := Shrink(in, DefaultMaxLongEdge); !sameSlice(out, in) {
			t.Errorf("%v: image within the limit was not returned as is", size)
		}
	}
}

func TestDisabled(t *testing.T) {
	in := encode(t, gradient(2000, 100))
	for _, limit := range []int{0, -1, -1568} {
		if out := Shrink(in, limit); !sameSlice(out, in) {
			t.Errorf("limit %d: input not returned as is", limit)
		}
		s := base64.StdEncoding.EncodeToString(in)
		if out := ShrinkBase64(s, limit); out != s {
			t.Errorf("limit %d: base64 input not returned as is", limit)
		}
	}
}

func TestUndecodableUnchanged(t *testing.T) {
	valid := encode(t, gradient(100, 50))
	cases := map[string][]byte{
		"garbage":       []byte("this is not a PNG at all, not even close"),
		"empty":         {},
		"signature":     valid[:8],
		"truncated":     valid[:len(valid)/2],
		"no-iend":       valid[:len(valid)-12],
		"corrupt-pixel": append(append([]byte{}, valid[:len(valid)-20]...), bytes.Repeat([]byte{0xAA}, 20)...),
		"jpeg-magic":    {0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10, 'J', 'F', 'I', 'F'},
	}
	for name, in := range cases {
		if out := Shrink(in, 10); !sameSlice(out, in) {
			t.Errorf("%s: input not returned as is", name)
		}
	}
}

func TestHugeHeaderUnchanged(t *testing.T) {
	// A well-formed header claiming 65536×65536 pixels (over maxPixels), a
	// tiny IDAT and IEND: left alone rather than decoded into gigabytes.
	chunk := func(typ string, data []byte) []byte {
		var c []byte
		c = binary.BigEndian.AppendUint32(c, uint32(len(data)))
		c = append(c, typ...)
		c = append(c, data...)
		return binary.BigEndian.AppendUint32(c, crc32.ChecksumIEEE(c[4:]))
	}
	var ihdr []byte
	ihdr = binary.BigEndian.AppendUint32(ihdr, 1<<16)
	ihdr = binary.BigEndian.AppendUint32(ihdr, 1<<16)
	ihdr = append(ihdr, 8, 0, 0, 0, 0) // 8-bit gray, no interlace
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(make([]byte, 1+1<<16)) // one filtered row
	zw.Close()
	in := []byte("\x89PNG\r\n\x1a\n")
	in = append(in, chunk("IHDR", ihdr)...)
	in = append(in, chunk("IDAT", z.Bytes())...)
	in = append(in, chunk("IEND", nil)...)
	cfg, err := png.DecodeConfig(bytes.NewReader(in))
	if err != nil || cfg.Width != 1<<16 || cfg.Height != 1<<16 {
		t.Fatalf("test input: config %+v, %v", cfg, err)
	}
	if out := Shrink(in, DefaultMaxLongEdge); !sameSlice(out, in) {
		t.Error("oversized image not returned as is")
	}
}

func TestBase64(t *testing.T) {
	in := encode(t, gradient(80, 2000))
	s := base64.StdEncoding.EncodeToString(in)
	outS := ShrinkBase64(s, 1568)
	out, err := base64.StdEncoding.DecodeString(outS)
	if err != nil {
		t.Fatalf("output is not base64: %v", err)
	}
	if !bytes.Equal(out, Shrink(in, 1568)) {
		t.Error("ShrinkBase64 disagrees with Shrink")
	}
	if b := decode(t, out).Bounds(); b.Dx() != 40 || b.Dy() != 1000 {
		t.Errorf("size = %v, want 40×1000", b.Size())
	}

	small := base64.StdEncoding.EncodeToString(encode(t, gradient(20, 20)))
	if got := ShrinkBase64(small, 1568); got != small {
		t.Error("small image not returned as is")
	}
	for _, bad := range []string{"!!!not base64!!!", "abc", base64.StdEncoding.EncodeToString([]byte("not a png"))} {
		if got := ShrinkBase64(bad, 10); got != bad {
			t.Errorf("%q: not returned as is, got %q", bad, got)
		}
	}
}

func TestExactPixels(t *testing.T) {
	src := image.NewNRGBA(image.Rect(0, 0, 3, 3))
	px := [3][3]color.NRGBA{
		{{0, 0, 0, 255}, {255, 255, 255, 255}, {10, 20, 30, 255}},
		{{100, 100, 100, 127}, {0, 0, 0, 0}, {200, 0, 0, 255}},
		{{1, 2, 3, 4}, {5, 6, 9, 8}, {255, 128, 7, 1}},
	}
	for y, row := range px {
		for x, c := range row {
			src.SetNRGBA(x, y, c)
		}
	}
	// limit 2, long edge 3 → f = 2 → 2×2.
	want := [2][2]color.NRGBA{
		{
			// (0+255+100+0)/4 = 88.75 → 89 for R, G and B;
			// alpha (255+255+127+0)/4 = 159.25 → 159.
			{89, 89, 89, 159},
			// Right edge, a 1×2 box: (10+200)/2, (20+0)/2, (30+0)/2, 255.
			{105, 10, 15, 255},
		},
		{
			// Bottom edge, a 2×1 box: (1+5)/2, (2+6)/2, (3+9)/2, (4+8)/2.
			{3, 4, 6, 6},
			// The corner, a 1×1 box: unchanged.
			{255, 128, 7, 1},
		},
	}
	got := asNRGBA(t, decode(t, Shrink(encode(t, src), 2)))
	if b := got.Bounds(); b.Dx() != 2 || b.Dy() != 2 {
		t.Fatalf("size = %v, want 2×2", b.Size())
	}
	for y := range want {
		for x, w := range want[y] {
			if c := got.NRGBAAt(x, y); c != w {
				t.Errorf("(%d,%d) = %v, want %v", x, y, c, w)
			}
		}
	}
}

func TestRoundingHalvesUp(t *testing.T) {
	// A 2×1 box of 0 and 1: the mean 0.5 rounds up to 1; 254 and 255 → 255.
	src := image.NewNRGBA(image.Rect(0, 0, 2, 1))
	src.SetNRGBA(0, 0, color.NRGBA{0, 254, 0, 255})
	src.SetNRGBA(1, 0, color.NRGBA{1, 255, 0, 255})
	got := asNRGBA(t, decode(t, Shrink(encode(t, src), 1)))
	if c, w := got.NRGBAAt(0, 0), (color.NRGBA{1, 255, 0, 255}); c != w {
		t.Errorf("got %v, want %v", c, w)
	}
}

func TestPalettedSource(t *testing.T) {
	pal := color.Palette{
		color.NRGBA{255, 0, 0, 255},
		color.NRGBA{0, 0, 255, 255},
		color.NRGBA{0, 255, 0, 0}, // fully transparent, colour still averaged
		color.NRGBA{40, 40, 40, 128},
	}
	src := image.NewPaletted(image.Rect(0, 0, 4, 2), pal)
	copy(src.Pix, []uint8{
		0, 1, 2, 3,
		1, 1, 3, 3,
	})
	in := encode(t, src)
	if _, ok := decode(t, in).(*image.Paletted); !ok {
		t.Fatal("source does not decode as paletted")
	}
	got := asNRGBA(t, decode(t, Shrink(in, 2)))
	if b := got.Bounds(); b.Dx() != 2 || b.Dy() != 1 {
		t.Fatalf("size = %v, want 2×1", b.Size())
	}
	want := []color.NRGBA{
		// red + 3×blue: R 255/4 = 63.75 → 64, B 765/4 = 191.25 → 191.
		{64, 0, 191, 255},
		// transparent green + 3×grey: R 120/4 = 30, G 375/4 = 93.75 → 94,
		// B 30, A 384/4 = 96.
		{30, 94, 30, 96},
	}
	for x, w := range want {
		if c := got.NRGBAAt(x, 0); c != w {
			t.Errorf("(%d,0) = %v, want %v", x, c, w)
		}
	}
}

func TestGraySource(t *testing.T) {
	src := image.NewGray(image.Rect(0, 0, 5, 4))
	copy(src.Pix, []uint8{
		0, 10, 20, 30, 40,
		50, 60, 70, 80, 90,
		100, 110, 120, 130, 140,
		150, 160, 170, 180, 201,
	})
	in := encode(t, src)
	if _, ok := decode(t, in).(*image.Gray); !ok {
		t.Fatal("source does not decode as gray")
	}
	// limit 3, long edge 5 → f = 2 → 3×2.
	got := asNRGBA(t, decode(t, Shrink(in, 3)))
	if b := got.Bounds(); b.Dx() != 3 || b.Dy() != 2 {
		t.Fatalf("size = %v, want 3×2", b.Size())
	}
	want := [2][3]uint8{
		{30, 50, 65},    // 120/4, 200/4, (40+90)/2
		{130, 150, 171}, // 520/4, 600/4, (140+201)/2 = 170.5 → 171
	}
	for y := range want {
		for x, v := range want[y] {
			if c, w := got.NRGBAAt(x, y), (color.NRGBA{v, v, v, 255}); c != w {
				t.Errorf("(%d,%d) = %v, want %v", x, y, c, w)
			}
		}
	}
}

// randomImages returns one image of each type the PNG decoder produces,
// filled with random (valid) pixels, plus one with a non-zero origin.
func randomImages(r *rand.Rand, w, h int) map[string]image.Image {
	rect := image.Rect(0, 0, w, h)
	fill := func(p []uint8) {
		for i := range p {
			p[i] = uint8(r.IntN(256))
		}
	}
	nrgba := image.NewNRGBA(rect)
	fill(nrgba.Pix)
	rgba := image.NewRGBA(rect)
	for i := 0; i < len(rgba.Pix); i += 4 {
		a := uint8(r.IntN(256))
		if r.IntN(4) == 0 {
			a = []uint8{0, 255}[r.IntN(2)]
		}
		for c := 0; c < 3; c++ {
			rgba.Pix[i+c] = uint8(r.IntN(int(a) + 1))
		}
		rgba.Pix[i+3] = a
	}
	rgba64 := image.NewRGBA64(rect)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			a := uint16(r.IntN(0x10000))
			if r.IntN(4) == 0 {
				a = []uint16{0, 0xffff}[r.IntN(2)]
			}
			c := color.RGBA64{uint16(r.IntN(int(a) + 1)), uint16(r.IntN(int(a) + 1)), uint16(r.IntN(int(a) + 1)), a}
			rgba64.SetRGBA64(x, y, c)
		}
	}
	nrgba64 := image.NewNRGBA64(rect)
	fill(nrgba64.Pix)
	gray := image.NewGray(rect)
	fill(gray.Pix)
	gray16 := image.NewGray16(rect)
	fill(gray16.Pix)
	pal := make(color.Palette, 200)
	for i := range pal {
		pal[i] = color.NRGBA{uint8(r.IntN(256)), uint8(r.IntN(256)), uint8(r.IntN(256)), uint8(r.IntN(256))}
	}
	paletted := image.NewPaletted(rect, pal)
	for i := range paletted.Pix {
		paletted.Pix[i] = uint8(r.IntN(len(pal)))
	}
	big := image.NewNRGBA(image.Rect(-3, 5, w+4, h+9))
	fill(big.Pix)
	return map[string]image.Image{
		"nrgba": nrgba, "rgba": rgba, "rgba64": rgba64, "nrgba64": nrgba64,
		"gray": gray, "gray16": gray16, "paletted": paletted,
		"cmyk-fallback": image.NewCMYK(rect),
		"subimage":      big.SubImage(image.Rect(-1, 7, w-1, h+7)),
	}
}

func TestFastPathsMatchNRGBAModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for name, img := range randomImages(r, 37, 11) {
		w := img.Bounds().Dx()
		read := rowReader(img)
		buf := make([]uint8, 4*w)
		ref := make([]uint8, 4*w)
		for y := 0; y < img.Bounds().Dy(); y++ {
			got := read(buf, y)
			want := readRowGeneric(img, ref, y)
			if !bytes.Equal(got, want) {
				t.Errorf("%s row %d:\n got %v\nwant %v", name, y, got, want)
				break
			}
		}
		for _, f := range []int{1, 2, 3, 5, 40} {
			if got, want := boxReduce(img, f), reference(img, f); !bytes.Equal(got.Pix, want.Pix) || got.Rect != want.Rect {
				t.Errorf("%s f=%d: boxReduce differs from the reference", name, f)
			}
		}
	}
}

func TestPutNRGBAMatchesModel(t *testing.T) {
	p := make([]uint8, 4)
	for a := 0; a < 256; a++ {
		for v := 0; v <= a; v++ {
			c := color.RGBA{uint8(v), uint8(v / 2), uint8(a - v), uint8(a)}
			putNRGBA(p, uint32(c.R)*0x101, uint32(c.G)*0x101, uint32(c.B)*0x101, uint32(c.A)*0x101)
			w := color.NRGBAModel.Convert(c).(color.NRGBA)
			if got := (color.NRGBA{p[0], p[1], p[2], p[3]}); got != w {
				t.Fatalf("%v: got %v, want %v", c, got, w)
			}
		}
	}
}

func TestSixteenBitEndToEnd(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	imgs := randomImages(r, 50, 30)
	for _, name := range []string{"nrgba64", "rgba64", "gray16", "rgba"} {
		in := encode(t, imgs[name])
		src := decode(t, in)
		got := asNRGBA(t, decode(t, Shrink(in, 20))) // f = 3
		if want := reference(src, 3); !bytes.Equal(got.Pix, want.Pix) || got.Rect != want.Rect {
			t.Errorf("%s (decoded as %T): differs from the reference", name, src)
		}
	}
}

func FuzzShrink(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, img := range randomImages(r, 9, 4) {
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err == nil {
			f.Add(buf.Bytes(), 3)
			f.Add(buf.Bytes(), 1)
		}
	}
	valid := encode(f, gradient(30, 7))
	f.Add(valid, 8)
	f.Add(valid, 100)
	f.Add(valid, 0)
	f.Add(valid[:len(valid)/2], 4)
	f.Add([]byte("garbage"), 4)
	f.Add([]byte{}, -1)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		out := Shrink(data, limit)
		if sameSlice(out, data) {
			return
		}
		if limit <= 0 {
			t.Fatalf("limit %d: input changed", limit)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("undecodable input changed: %v", err)
		}
		img, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("output does not decode: %v", err)
		}
		b := img.Bounds()
		if max(b.Dx(), b.Dy()) > limit {
			t.Fatalf("output %v exceeds limit %d", b.Size(), limit)
		}
		fac := (max(cfg.Width, cfg.Height) + limit - 1) / limit
		if b.Dx() != (cfg.Width+fac-1)/fac || b.Dy() != (cfg.Height+fac-1)/fac {
			t.Fatalf("input %d×%d limit %d: output %v", cfg.Width, cfg.Height, limit, b.Size())
		}
	})
}

func BenchmarkShrink(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	img := image.NewNRGBA(image.Rect(0, 0, 4000, 3000))
	for i := range img.Pix {
		img.Pix[i] = uint8(r.IntN(16)) * 16 // some entropy, still compressible
	}
	in := encode(b, img)
	b.SetBytes(int64(len(in)))
	b.ResetTimer()
	for b.Loop() {
		if out := Shrink(in, DefaultMaxLongEdge); len(out) == len(in) {
			b.Fatal("not shrunk")
		}
	}
}
