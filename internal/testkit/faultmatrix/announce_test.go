package faultmatrix_test

import (
	"strings"
	"testing"
)

// TestAnnouncementErrors checks the check of the relay's down and back
// lines on outputs written by hand: in log mode a database fault may be
// announced by the stream or by the table relay, but by one of them.
func TestAnnouncementErrors(t *testing.T) {
	t.Parallel()
	lines := func(ls ...string) string { return strings.Join(ls, "\n") }
	for _, tc := range []struct {
		name, out, signals string
		be                 backend
		want               string // a part of the one error expected, or "" for none
	}{
		{"table mode, batch path announced", lines(storeDownLine, storeBackLine), "store", backendPostgres, ""},
		{"log mode, stream announced", lines(streamLostLine, streamBackLine), "store", backendLog, ""},
		{"log mode, table relay announced", lines(storeDownLine, storeBackLine), "store", backendLog, ""},
		{"log mode, both announced", lines(streamLostLine, storeDownLine, storeBackLine, streamBackLine), "store", backendLog, ""},
		{"log mode, silent", "", "store", backendLog, "never logged"},
		{"table mode, silent", "", "store", backendPostgres, "never logged"},
		{"ordered, no batch ran: the monitor and /healthz announced", lines(monitorDownLine, healthzDownLine), "store", backendPostgres, ""},
		{"broker fault, only the monitor's line", lines(monitorDownLine), "broker", backendPostgres, "never logged"},
		{"table mode, only the stream's lines", lines(streamLostLine, streamBackLine), "store", backendMariaDB, "never logged"},
		{"the fault met the relay's start", lines(startDownLine, startBackLine), "store", backendPostgres, ""},
		{"the relay never started", lines(startDownLine), "store", backendPostgres, "left unannounced"},
		{"broker, silent", lines(storeDownLine, storeBackLine), "broker", backendLog, "never logged"},
		{"down without back", lines(streamLostLine), "store", backendLog, "left unannounced"},
		{"nothing to announce", "", "", backendLog, ""},
		{"per failure", strings.Repeat(brokerDownLine+"\n"+brokerBackLine+"\n", 7), "broker", backendPostgres, "per failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := announcementErrors(tc.out, tc.signals, tc.be)
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Errorf("errors %q, want none", errs)
			case tc.want != "" && (len(errs) != 1 || !strings.Contains(errs[0], tc.want)):
				t.Errorf("errors %q, want one with %q", errs, tc.want)
			}
		})
	}
}
