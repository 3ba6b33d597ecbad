import { defineGatesRaceSuite } from '../suites/gates-race.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineGatesRaceSuite(sqliteFixture, 3, 2);
