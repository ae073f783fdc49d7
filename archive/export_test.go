package archive

// SetCrash makes a stop at the named point of a step (see crashPoints in
// the tests) when f returns an error, as a killed process would.
func SetCrash(a *Archiver, f func(point string) error) { a.crash = f }
