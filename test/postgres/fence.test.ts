import { defineFenceSuite } from '../suites/fence.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineFenceSuite(postgresFixture);
