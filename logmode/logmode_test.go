package logmode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
	"github.com/txoutbox/txoutbox/logmode"
)

// nowhere is a Source that is never streamed: New's checks come first.
type nowhere struct{}

func (nowhere) Describe() (string, string)                 { return "slot", "none" }
func (nowhere) Table(core.RelayOptions) logstream.Table    { return nil }
func (nowhere) Classify(error) (logstream.Verdict, string) { return logstream.Fatal, "" }
func (nowhere) Lag(context.Context) (time.Duration, error) { return 0, nil }
func (nowhere) Close()                                     {}
func (nowhere) Session(context.Context, *logstream.Stream, func()) error {
	return errors.New("never streamed")
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	pub := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })
	store := memoutbox.New(memoutbox.Options{})
	for name, f := range map[string]func() error{
		"no source": func() error { _, err := logmode.New(store, pub, nil, logmode.Options{}); return err },
		"no store":  func() error { _, err := logmode.New(nil, pub, nowhere{}, logmode.Options{}); return err },
		"negative StandbyInterval": func() error {
			_, err := logmode.New(store, pub, nowhere{}, logmode.Options{StandbyInterval: -time.Second})
			return err
		},
	} {
		if err := f(); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: %v, want ErrInvalidOptions", name, err)
		}
	}
	if _, err := logmode.New(store, pub, nowhere{}, logmode.Options{}); err != nil {
		t.Fatalf("valid options: %v", err)
	}
}
