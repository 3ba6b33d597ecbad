import { defineRoundTripSuite } from '../suites/round-trips.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineRoundTripSuite(postgresFixture);
