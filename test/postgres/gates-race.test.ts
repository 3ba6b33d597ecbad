import { defineGatesRaceSuite } from '../suites/gates-race.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineGatesRaceSuite(postgresFixture, 6, 2);
