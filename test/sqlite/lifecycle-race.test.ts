import { defineLifecycleRaceSuite } from '../suites/lifecycle-race.suite.js';
import { sqliteFixture } from '../support/dialects.js';

// 8 processes on one SQLite file, one claimer each.
defineLifecycleRaceSuite(sqliteFixture, 8, 1);
