import { defineFuzzSuite } from '../suites/fuzz.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineFuzzSuite(postgresFixture);
