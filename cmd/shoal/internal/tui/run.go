package tui

import (
	"context"
	"errors"
	"io"

	tea "charm.land/bubbletea/v2"
)

// Run shows the monitor full-screen on a terminal, reading keys and the
// mouse from in and drawing on out, until the user quits or ctx ends
// (which is not an error).
func Run(ctx context.Context, src Source, opts Options, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := New(ctx, src, opts)
	// The alternate screen and the mouse are asked for by the view.
	_, err := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(in), tea.WithOutput(out)).Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil
	}
	return err
}
