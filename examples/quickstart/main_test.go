package main

import (
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

func TestQuickstart(t *testing.T) {
	t.Parallel()
	sum, err := run("", 30, 0.3, 0.2, false)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Distinct != 30 || sum.Published != 30 || sum.Pending != 0 || sum.Dead != 0 {
		t.Errorf("summary %+v: want all 30 events published and delivered, nothing pending", sum)
	}
	if sum.FailedAttempts == 0 || sum.FailedAttempts != sum.Refused+sum.LostAcks {
		t.Errorf("summary %+v: every injected fault must be a counted, retried attempt", sum)
	}
	if sum.LostAcks > 0 && sum.Deliveries <= sum.Distinct {
		t.Errorf("summary %+v: a lost acknowledgement must show up as a duplicate", sum)
	}
	if sum.RolledBackDelivered != 0 {
		t.Errorf("the rolled-back order's event was delivered %d times", sum.RolledBackDelivered)
	}
}

// The quickstart on MariaDB (-dsn mysql://...).
func TestQuickstartMariaDB(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := run("mysql://"+url.UserPassword(cfg.User, cfg.Passwd).String()+"@"+cfg.Addr+"/"+cfg.DBName, 30, 0.3, 0.2, false)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Distinct != 30 || sum.Published != 30 || sum.Pending != 0 || sum.Dead != 0 || sum.RolledBackDelivered != 0 {
		t.Errorf("summary %+v: want all 30 events published and delivered, nothing pending, the rolled-back one never", sum)
	}
}
