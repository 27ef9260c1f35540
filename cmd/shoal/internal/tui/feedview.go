package tui

// feedView is where the feed pane stands. It shows an agent's lines
// oldest at the top and newest at the bottom, like a terminal: while it
// follows, the newest line is the last one shown and new lines scroll the
// others up; once the user moves up it stays where they put it until
// they come back down to the newest.
type feedView struct {
	follow bool
	sel    int // the selected line's id (feed.dropped + index)
	top    int // the id of the first line shown
}

// fit settles the view on f for h rows and returns the ids of the lines
// shown, from (included) to (excluded).
func (v *feedView) fit(f *feed, h int) (from, to int) {
	n := len(f.lines)
	if n == 0 || h <= 0 {
		return 0, 0
	}
	lo, hi := f.dropped, f.dropped+n-1
	if v.follow {
		v.sel = hi
	}
	v.sel = max(lo, min(v.sel, hi))
	if v.sel < v.top {
		v.top = v.sel
	}
	if v.sel >= v.top+h {
		v.top = v.sel - h + 1
	}
	if v.follow {
		v.top = hi - h + 1
	}
	v.top = max(lo, min(v.top, hi-h+1))
	return v.top, min(hi+1, v.top+h)
}

// move moves the selection by d lines; reaching the newest follows it.
func (v *feedView) move(f *feed, d int) {
	n := len(f.lines)
	if n == 0 {
		return
	}
	lo, hi := f.dropped, f.dropped+n-1
	if v.follow {
		v.sel = hi
	}
	v.sel = max(lo, min(v.sel+d, hi))
	v.follow = v.sel == hi
}

// selectedLine is the line under the feed's selection.
func (v *feedView) selectedLine(f *feed) (line, bool) {
	if f == nil || len(f.lines) == 0 {
		return line{}, false
	}
	i := len(f.lines) - 1
	if !v.follow {
		i = v.sel - f.dropped
	}
	if i < 0 || i >= len(f.lines) {
		return line{}, false
	}
	l := f.lines[i]
	l.text = f.text(i)
	return l, true
}
