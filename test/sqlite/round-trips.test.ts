import { defineRoundTripSuite } from '../suites/round-trips.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineRoundTripSuite(sqliteFixture);
