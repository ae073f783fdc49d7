// Command cpuexec runs a test binary for `go test -exec` and records the
// CPU time it and the processes it waited for used (relays, consumers,
// the CLI under test), so that make test can say which packages the
// machine's cores went to: on a saturated 2-core machine a package's wall
// time says little, its CPU time says what it costs every other package.
//
//	TXOUTBOX_CPU_LOG=cpu.log go test -exec "$PWD/cpuexec" ./...
//	go run ./internal/testkit/cmd/cpuexec -report 10 <cpu.log
//
// Each line of the log is the package's directory, then its user and
// system seconds.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-report" {
		n, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "cpuexec: -report N")
			os.Exit(2)
		}
		root, _ := os.Getwd()
		report(os.Stdin, os.Stdout, root, n)
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "cpuexec: usage: cpuexec test-binary [args...]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}

// run runs the binary with args, forwarding the signals go test sends it
// (a timeout's SIGQUIT), and logs its CPU time.
func run(bin string, args []string) int {
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGQUIT, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "cpuexec:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	_ = cmd.Wait()
	signal.Stop(sigs)
	if path := os.Getenv("TXOUTBOX_CPU_LOG"); path != "" && cmd.ProcessState != nil {
		// wait4's usage of the child includes the children it waited for.
		user, sys := cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
		dir, _ := os.Getwd()
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(f, "%s %.1f %.1f\n", dir, user.Seconds(), sys.Seconds())
			f.Close()
		}
	}
	if cmd.ProcessState == nil {
		return 1
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	return 1
}

// report reads the log from r and prints to w the n packages that used the
// most CPU, their directories relative to root, and the total.
func report(r io.Reader, w io.Writer, root string, n int) {
	type usage struct {
		dir       string
		user, sys float64
	}
	byDir := map[string]*usage{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		u, _ := strconv.ParseFloat(f[1], 64)
		s, _ := strconv.ParseFloat(f[2], 64)
		if byDir[f[0]] == nil {
			byDir[f[0]] = &usage{dir: f[0]}
		}
		byDir[f[0]].user += u
		byDir[f[0]].sys += s
	}
	all := make([]*usage, 0, len(byDir))
	var total float64
	for _, u := range byDir {
		all = append(all, u)
		total += u.user + u.sys
	}
	sort.Slice(all, func(i, j int) bool { return all[i].user+all[i].sys > all[j].user+all[j].sys })
	fmt.Fprintf(w, "The %d packages that used the most CPU (test binary and the processes it ran; %s in all):\n", min(n, len(all)), time.Duration(total*float64(time.Second)).Round(time.Second))
	for _, u := range all[:min(n, len(all))] {
		dir := strings.TrimPrefix(strings.TrimPrefix(u.dir, root), "/")
		fmt.Fprintf(w, "  %7.1fs  (user %.1fs, sys %.1fs)  %s\n", u.user+u.sys, u.user, u.sys, dir)
	}
}
