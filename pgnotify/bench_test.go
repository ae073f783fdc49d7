package pgnotify_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/pgnotify"
)

// BenchmarkNotify is the cost Notify adds to every Enqueue: no I/O, one
// atomic add and a non-blocking channel send.
func BenchmarkNotify(b *testing.B) {
	n, err := pgnotify.NewNotifier("postgres://localhost/x", pgnotify.NotifierOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Notify()
		}
	})
}

// BenchmarkRoundTrip measures Notify to the Listener's wake-up of its
// target, through the real server: the floor of the cross-process wake-up.
func BenchmarkRoundTrip(b *testing.B) {
	dsn := testenv.PostgresDSN(b)
	w := newWakes()
	l, err := pgnotify.NewListener(dsn, w, pgnotify.ListenerOptions{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	runB(b, l.Run)
	<-l.Ready()
	<-w.ch
	n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	runB(b, n.Run)
	b.ResetTimer()
	for b.Loop() {
		n.Notify()
		<-w.ch
	}
}
